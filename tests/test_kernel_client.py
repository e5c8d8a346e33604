"""The grader's kernel client runs no heartbeat thread (labkit/grading/kernel_box.py).

jupyter_client's heartbeat thread can wait forever on a kernel whose sockets a cell wrote over,
and `stop_channels()` joins it without a timeout: the hostile `fdw` submission hung its grading
worker that way until the batch killed it. Without the thread there is nothing to hang on.
"""

from __future__ import annotations

import socket

from labkit.grading.kernel_box import NoHeartbeatClient


def _free_ports(count: int) -> list[int]:
    held = [socket.socket() for _ in range(count)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def test_the_grading_client_starts_every_channel_but_the_heartbeat():
    shell, iopub, stdin, control, hb = _free_ports(5)
    client = NoHeartbeatClient()
    client.load_connection_info({"transport": "tcp", "ip": "127.0.0.1", "shell_port": shell, "iopub_port": iopub,
                                 "stdin_port": stdin, "control_port": control, "hb_port": hb, "key": ""})
    client.start_channels()
    try:
        assert client.shell_channel.is_alive() and client.iopub_channel.is_alive()
        assert not client.hb_channel.is_alive()
    finally:
        client.stop_channels()
