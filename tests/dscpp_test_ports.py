"""Rendezvous ports for the tests' jobs: free_port(), a port the kernel reports free now.

CI runs the tests two at a time (ctest -j2) beside other jobs, so a test never picks its ports
from a fixed base: two bases a few ports apart walk into each other, and into another job's.
Each job takes its own port from free_port() instead (one call per launch).

The port is also held until this process exits: the socket that found it stays bound to
0.0.0.0:PORT with SO_REUSEADDR and never listens. While it is bound the kernel gives the port
to no other bind(port 0) nor connect(), so no one else is handed it between this call and the
moment rank 0 serves its store there; rank 0's TCPStore (LibTorch's, libuv's, Python's) binds
with SO_REUSEADDR as well, which a bound, non-listening socket allows. The socket is not
inherited by the processes the test starts (Python's sockets are non-inheritable).
Programs started by dscpp can also get `--master_port 0`, the launcher's own free port
(docs/launcher.md); this module is for the tests that must know the port, or start ranks
without dscpp.
"""
import socket

_held = []  # the reservations, closed when the test's process exits


def free_port():
    """A TCP port free on every address now, held (see above) for this process's life."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 0))
    _held.append(s)
    return s.getsockname()[1]
