"""bench/scriptload.py: the bench scripts' shared way to load scripts/bench
(a Python script without a .py name) and each other as modules.

Each file is loaded once per process and registered in sys.modules, so a
script that loads scripts/bench directly and through another bench script
gets the same module. Stdlib only.
"""
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def load(name, path):
    """The module `name` loaded from `path`, loading it on first use."""
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = mod
    try:
        loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def bench_script():
    """scripts/bench, as a module (its servers, loadgen runs and helpers)."""
    return load("mcp_bench_script", os.path.join(ROOT, "scripts", "bench"))
