// Loaded with `node --import` into a stock Node.js MCP server, such as the
// reference server `server-everything`, which listens on $PORT on every
// interface and cannot be told a host or a socket. Its listen() takes the
// socket the test hands it as descriptor $MCP_TEST_LISTEN_FD instead: a
// loopback port the test holds, so that the server never listens beyond
// loopback, and can be killed and started again on the same port with no
// moment when another test could take it (broker/tests/upstream.rs).
import net from 'node:net';

const fd = Number(process.env.MCP_TEST_LISTEN_FD);
if (!Number.isInteger(fd)) {
  throw new Error('listen-fd.mjs: MCP_TEST_LISTEN_FD is not a descriptor');
}
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const done = args.find((a) => typeof a === 'function');
  return listen.call(this, { fd }, done);
};
