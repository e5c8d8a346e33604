"""The grader's kernel client runs no heartbeat thread (labkit/grading/kernel_box.py).

jupyter_client's heartbeat thread can wait forever on a kernel whose sockets a cell wrote over,
and `stop_channels()` joins it without a timeout: the hostile `fdw` submission hung its grading
worker that way until the batch killed it. Without the thread there is nothing to hang on.
"""

from __future__ import annotations

import contextlib

from labkit.grading.kernel_box import NoHeartbeatClient
from labkit.judge import ports


@contextlib.contextmanager
def _refusing_ports(count: int):
    """Ports bound and never listening while the test runs: the client's connections are refused,
    and no other test's listener on this machine can be given one meanwhile (and take these
    connections for clients of its own)."""
    held = [ports.refusing_port() for _ in range(count)]
    try:
        yield [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def test_the_grading_client_starts_every_channel_but_the_heartbeat():
    with _refusing_ports(5) as (shell, iopub, stdin, control, hb):
        client = NoHeartbeatClient()
        client.load_connection_info({"transport": "tcp", "ip": "127.0.0.1", "shell_port": shell, "iopub_port": iopub,
                                     "stdin_port": stdin, "control_port": control, "hb_port": hb, "key": ""})
        client.start_channels()
        try:
            assert client.shell_channel.is_alive() and client.iopub_channel.is_alive()
            assert not client.hb_channel.is_alive()
        finally:
            client.stop_channels()
