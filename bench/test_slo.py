"""Tests of bench/slo.py's decisions: the verdict on one probe, the sweep and
bisection, and how rounds combine into a goal's figure. Run by
`bench/tests/slo_logic.rs` (so `cargo test` runs them), or alone:

  python3 bench/test_slo.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slo as S  # noqa: E402


def point(rate, p99, *, kept_up=True, achieved=None, errors=0, own_lag=1, stall=80,
          scheme="http"):
    return {"rate": rate, "p99_us": p99, "kept_up": kept_up, "errors": errors,
            "failure": None, "achieved_rps": rate if achieved is None else achieved,
            "generator_lag_us": {"p50": 1, "p99": own_lag, "max": own_lag},
            "generator_stalls_us": {"p50": 60, "p99": stall, "max": stall},
            "scheme": scheme}


def server(knee, flaky=()):
    """A server whose p99 is 200 µs below `knee` req/s and 3 ms at or
    above it; rates in `flaky` fail their first try only."""
    tries = {}

    def run(rate):
        tries[rate] = tries.get(rate, 0) + 1
        bad = rate >= knee or (rate in flaky and tries[rate] == 1)
        return point(rate, 3000 if bad else 200)
    return run


class Verdict(unittest.TestCase):
    def test_within_the_slo_holds(self):
        self.assertEqual(S.verdict(point(1000, 999)), "holds")

    def test_p99_over_the_slo_is_the_servers(self):
        self.assertEqual(S.verdict(point(1000, 1001)), "server")

    def test_errors_fail_whatever_the_latency(self):
        self.assertEqual(S.verdict(point(1000, 100, errors=1)), "server")

    def test_answers_short_of_the_rate_fail(self):
        self.assertEqual(S.verdict(point(1000, 100, achieved=970)), "server")

    def test_a_late_generator_excuses_a_p99_it_explains(self):
        # 400 µs of the generator's own lag, taken off a 1.3 ms p99, leaves
        # the server within the SLO.
        self.assertEqual(S.verdict(point(1000, 1300, own_lag=400)), "generator")

    def test_a_late_generator_does_not_excuse_a_slow_server(self):
        self.assertEqual(S.verdict(point(1000, 4000, own_lag=400)), "server")

    def test_a_stalled_generator_excuses_a_p99_the_stall_explains(self):
        # Its workers on time (own lag 1 µs), but the process stalled 600 µs:
        # answers waited unread that long, and a 1.3 ms p99 may be that.
        self.assertEqual(S.verdict(point(1000, 1300, stall=600)), "generator")
        self.assertEqual(S.verdict(point(1000, 4000, stall=600)), "server")
        # Reports from before the stall meter have no such field.
        p = point(1000, 1300)
        del p["generator_stalls_us"]
        self.assertEqual(S.verdict(p), "server")


class Capacity(unittest.TestCase):
    def test_sweep_then_bisection_finds_the_knee(self):
        c = S.capacity(server(37_000), start=1000, bisect_steps=4)
        # 1k..32k hold, 64k fails; then 48k, 40k fail, 36k holds, 38k fails.
        self.assertEqual(c["capacity"], 36_000)
        self.assertEqual(c["bound"], "server")
        held = sorted({p["rate"] for p in c["points"] if p["verdict"] == "holds"})
        self.assertEqual(held, [1000, 2000, 4000, 8000, 16000, 32000, 36000])
        # Every failing rate was tried twice.
        for r in (64_000, 48_000, 40_000, 38_000):
            self.assertEqual(sum(p["rate"] == r for p in c["points"]), 2, r)

    def test_one_failed_try_does_not_fail_a_rate(self):
        c = S.capacity(server(37_000, flaky={16_000}), start=1000, bisect_steps=4)
        self.assertEqual(c["capacity"], 36_000)

    def test_without_confirmation_one_failed_try_fails_the_rate(self):
        c = S.capacity(server(37_000, flaky={16_000}), start=1000, bisect_steps=2,
                       confirm=False)
        # 16k fails; 12k and 14k hold between 8k and 16k.
        self.assertEqual(c["capacity"], 14_000)

    def test_a_server_failing_at_the_start_is_looked_at_below_it(self):
        c = S.capacity(server(300), start=1000, bisect_steps=4)
        # 500 and 250 tried below the start; 250 holds; then bisected up.
        self.assertIsNotNone(c["capacity"])
        self.assertLess(c["capacity"], 300)
        self.assertGreaterEqual(c["capacity"], 250)

    def test_a_server_failure_decides_a_rate_whose_other_try_was_the_generators(self):
        # At and above the knee, one try fails on the server's tails with the
        # generator on time, the other with the generator late by enough to
        # excuse it (as broker-wasm's sweeps on 2026-12-06, at 98-100% of
        # its core): the rate is the server's, whichever try came first.
        for late_first in (True, False):
            tries = {}

            def run(rate, late_first=late_first):
                tries[rate] = tries.get(rate, 0) + 1
                if rate < 37_000:
                    return point(rate, 200)
                late = (tries[rate] % 2 == 1) == late_first
                return point(rate, 1100, own_lag=150) if late else point(rate, 2700)
            c = S.capacity(run, start=1000, bisect_steps=4)
            self.assertEqual(c["capacity"], 36_000, late_first)
            self.assertEqual(c["bound"], "server", late_first)
            verdicts = {p["verdict"] for p in c["points"] if p["rate"] >= 37_000}
            self.assertEqual(verdicts, {"server", "generator"}, late_first)

    def test_two_late_generators_leave_the_rate_to_the_generator(self):
        def run(rate):
            return point(rate, 200) if rate < 37_000 else point(rate, 1100, own_lag=150)
        c = S.capacity(run, start=1000, bisect_steps=4)
        self.assertEqual(c["capacity"], 36_000)
        self.assertEqual(c["bound"], "generator")

    def test_a_recorded_sweep_replays_to_itself_and_to_todays_rules(self):
        c = S.capacity(server(37_000, flaky={16_000}), start=1000, bisect_steps=4)
        self.assertEqual(S.redecide(c), (c, True))
        # As the old rule recorded it: a rate failed once by the server and
        # once with a late generator was the generator's. Today, the server's.
        old = {**c, "bound": "generator"}
        knee = 38_000  # the lowest rate that failed both tries
        late = next(i for i, p in enumerate(c["points"]) if p["rate"] == knee)
        old["points"] = [dict(p) for p in c["points"]]
        old["points"][late] = {**point(knee, 1100, own_lag=150), "verdict": "generator"}
        now, exact = S.redecide(old)
        self.assertTrue(exact)
        self.assertEqual((now["capacity"], now["bound"]), (36_000, "server"))
        # A record that lacks a probe the sweep asks for is flagged.
        self.assertFalse(S.redecide({**c, "points": c["points"][:5]})[1])

    def test_a_server_holding_nothing_has_no_capacity(self):
        c = S.capacity(server(1), start=1000, bisect_steps=2)
        self.assertIsNone(c["capacity"])
        self.assertEqual(S.fmt_capacity(c), "none (p99 over the SLO at the lowest rate)")


def rnd(cap):
    return {"capacity": cap, "bound": "server", "points": [point(cap or 1, 100)]}


class Rounds(unittest.TestCase):
    def test_one_round_is_itself(self):
        r = rnd(5)
        self.assertIs(S.combine([r]), r)

    def test_the_lower_median_round_stands_for_the_server(self):
        rs = [rnd(54_000), rnd(31_000), rnd(52_000)]
        c = S.combine(rs)
        self.assertEqual(c["capacity"], 52_000)
        self.assertEqual(c["median_round"], 2)
        self.assertIs(c["points"], rs[2]["points"])
        self.assertEqual(c["rounds"], rs)
        # An even count takes the lower of the two middle rounds.
        self.assertEqual(S.combine([rnd(4), rnd(1), rnd(3), rnd(2)])["capacity"], 2)

    def test_a_round_that_held_nothing_ranks_lowest(self):
        self.assertIsNone(S.combine([rnd(None), rnd(None), rnd(7)])["capacity"])
        self.assertEqual(S.combine([rnd(None), rnd(9), rnd(7)])["capacity"], 7)

    def test_ratios_pair_rounds_in_order(self):
        broker = S.combine([rnd(54_000), rnd(31_000), rnd(52_000)])
        rmcp = S.combine([rnd(17_000), rnd(25_000), rnd(18_000)])
        pr = S.paired_ratios(broker, rmcp)
        self.assertEqual([(round(x, 2), sd) for x, sd in pr],
                         [(3.18, "="), (1.24, "="), (2.89, "=")])
        r, side, met = S.decide(pr, 3.0)
        self.assertAlmostEqual(r, 52 / 18)
        self.assertEqual((side, met), ("=", False))
        self.assertTrue(S.decide(pr, 2.5)[2])

    def test_a_single_run_is_one_round_and_a_baseline_holding_nothing_gives_no_ratio(self):
        # A server measured once is one round.
        self.assertEqual(S.paired_ratios(rnd(6), rnd(3)), [(2.0, "=")])
        pr = S.paired_ratios(S.combine([rnd(4), rnd(6)]), S.combine([rnd(None), rnd(3)]))
        self.assertEqual(pr, [(None, "="), (2.0, "=")])
        self.assertEqual(S.decide(pr, 1.0), (2.0, "=", True))
        self.assertEqual(S.decide([(None, "=")], 1.0), (None, "=", None))

    def test_rounds_that_disagree_wildly_decide_nothing(self):
        # 2026-12-06: echo-baseline starved in one round (1,437 req/s).
        starved = [(0.46, "="), (0.79, "="), (89.07, "=")]
        self.assertGreater(S.round_spread(starved), S.ROUND_SPREAD_LIMIT)
        self.assertEqual(S.decide(starved, 0.75), (0.79, "=", None))
        # The widest spread of the paired runs before it still decides.
        self.assertEqual(S.decide([(0.44, "="), (0.89, "="), (0.34, "=")], 0.75),
                         (0.44, "=", False))
        self.assertIsNone(S.round_spread([(2.0, "=")]))

    def test_a_floor_decides_only_on_its_side_of_the_limit(self):
        def bound(cap, b):
            return {**rnd(cap), "bound": b}
        # The baseline's sweep stopped at the generator: the ratio is a
        # ceiling, which can fail a goal but not meet it.
        broker = S.combine([rnd(46_000)] * 3)
        tonic = S.combine([bound(46_000, "generator"), bound(44_000, "generator"),
                           rnd(40_000)])
        pr = S.paired_ratios(broker, tonic)
        self.assertEqual([sd for _, sd in pr], ["<=", "<=", "="])
        # Median round by ratio: 46/44 (a ceiling above 1.0): undecided.
        self.assertEqual(S.decide(pr, 1.0)[1:], ("<=", None))
        # The same ceiling below a higher limit fails it.
        self.assertEqual(S.decide(pr, 1.1)[1:], ("<=", False))
        # A floor above the limit meets it; below, it decides nothing.
        floors = [(1.2, ">="), (1.3, ">="), (0.9, "=")]
        self.assertEqual(S.decide(floors, 1.0), (1.2, ">=", True))
        self.assertEqual(S.decide(floors, 1.25), (1.2, ">=", None))
        self.assertEqual(S.decide([(1.0, "?")], 1.0), (1.0, "?", None))


if __name__ == "__main__":
    unittest.main()
