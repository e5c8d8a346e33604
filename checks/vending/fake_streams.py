"""Lab `vending`, child side: the event loops and stream fakes the probes run async student code with.

A virtual-clock loop for cases whose I/O never leaves the process, a writer that records each
call (and can make drain or wait_closed hang or fail), a scripted reader, and the two helpers that
start a student's coroutine and describe how it ended. Listed under `probes` in manifest.toml.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from labkit import probe
from labkit.values import encode

if TYPE_CHECKING:  # a probe's Recorder (notes each call), never imported here at run time
    from checks.vending.probes import Recorder

INJECTED = "(injected by the judge)"


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready.

    Only for cases whose I/O never leaves this process: a wait on the network would be
    skipped over instead of waited for.
    """

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        real_select = self._selector.select

        def select(timeout=None):
            events = real_select(0 if timeout is not None else 0.01)
            if not events and timeout:
                self._now += timeout
            return events

        self._selector.select = select

    def time(self) -> float:
        return self._now


def run_async(make: Callable[[], Any], virtual: bool) -> Any:
    """Run one case's coroutine in a fresh loop (virtual clock or real)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop if virtual else None) as runner:
        return runner.run(make())


async def start(fn: Callable | None, *args, **kwargs) -> tuple[asyncio.Task | None, dict | None]:
    """Call a student's async function and wrap the coroutine in a task, or say why not."""
    if fn is None:
        return None, {"kind": "missing"}
    try:
        coro = fn(*args, **kwargs)
    except Exception as exc:
        return None, probe.describe_exception(exc)
    if not inspect.isawaitable(coro):
        return None, {"kind": "not_async", "value": encode(coro)}
    return asyncio.ensure_future(coro), None


async def settle(task: asyncio.Task, seconds: float) -> tuple[dict, Any]:
    """Wait at most `seconds` for the task; describe how it ended (hung, cancelled, ...)."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return {"kind": "hung", "seconds": seconds}, None
    if task.cancelled():
        return {"kind": "cancelled"}, None
    error = task.exception()
    if error is not None:
        return probe.describe_exception(error), error
    return {"kind": "returned", "value": encode(task.result())}, task.result()


async def never() -> None:
    await asyncio.get_running_loop().create_future()


class FakeTransport:
    def __init__(self, rec: Recorder, real=None) -> None:
        self._rec = rec
        self._real = real

    def abort(self) -> None:
        self._rec.note("abort")
        if self._real is not None:
            self._real.abort()

    def close(self) -> None:
        self._rec.note("transport_close")
        if self._real is not None:
            self._real.close()

    def is_closing(self) -> bool:
        return self._real.is_closing() if self._real is not None else False

    def get_extra_info(self, name, default=None):
        return self._real.get_extra_info(name, default) if self._real is not None else default


class SpyWriter:
    """A StreamWriter seen through a keyhole: records each call, then does it for real.

    `drain` may be told to fail ("raise") or never end ("hang"), once, for fault cases.
    Without a real writer underneath it is a fake whose `wait_closed` can hang or fail.
    """

    def __init__(self, rec: Recorder, real: asyncio.StreamWriter | None = None,
                 drain: str | None = None, wait_closed: str | None = None) -> None:
        self._rec = rec
        self._real = real
        self._drain = drain
        self._wait_closed = wait_closed
        self._closed = False
        self.transport = FakeTransport(rec, real.transport if real is not None else None)

    def write(self, data) -> None:
        self._rec.note("write", data=encode(data), last_committed=self._rec.last_committed())
        if self._real is not None:
            self._real.write(data)

    def writelines(self, data) -> None:
        for chunk in data:
            self.write(chunk)

    def write_eof(self) -> None:
        self._rec.note("write_eof")
        if self._real is not None:
            self._real.write_eof()

    def drain(self):
        self._rec.note("drain")  # noted when called: wait_for(drain(), 0) may never run it
        return self._drained()

    async def _drained(self) -> None:
        mode, self._drain = self._drain, None
        if mode == "raise":
            raise ConnectionResetError(104, f"Connection reset by peer {INJECTED}")
        if mode == "hang":
            await never()
        if self._real is not None:
            await self._real.drain()

    def close(self) -> None:
        self._rec.note("close")
        self._closed = True
        if self._real is not None:
            self._real.close()

    def is_closing(self) -> bool:
        return self._real.is_closing() if self._real is not None else self._closed

    def wait_closed(self):
        self._rec.note("wait_closed")  # noted when called, like drain
        return self._closed_waited()

    async def _closed_waited(self) -> None:
        if self._wait_closed == "hang":
            await never()
        if self._wait_closed == "reset":
            raise ConnectionResetError(104, f"Connection reset by peer {INJECTED}")
        if self._real is not None:
            await self._real.wait_closed()

    def get_extra_info(self, name, default=None):
        return self._real.get_extra_info(name, default) if self._real is not None else default

    def can_write_eof(self) -> bool:
        return False

    @property
    def really_closed(self) -> bool:
        """Was the socket underneath closed (by close() or abort())?"""
        return self._real.is_closing() if self._real is not None else self._closed

    def abandon(self) -> None:
        """After the judge looked: close a real socket the student's code left open."""
        if self._real is not None and not self._real.is_closing():
            self._real.transport.abort()


def scripted_reader(case: dict) -> asyncio.StreamReader:
    """A StreamReader (limit 64, like run_client's) fed on the loop's clock: each `[delay, data]`
    of the script `delay` seconds after the previous one, then EOF, a reset, or nothing more."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64)
    at = 0.0
    for delay, data in case.get("script", []):
        at += delay
        if at == 0:
            reader.feed_data(data.encode("latin-1"))
        else:
            loop.call_later(at, reader.feed_data, data.encode("latin-1"))
    end = case.get("end", "eof")
    at += case.get("end_after", 0.0)
    if end == "eof":
        if at == 0:
            reader.feed_eof()
        else:
            loop.call_later(at, reader.feed_eof)
    elif end == "reset":
        error = ConnectionResetError(104, f"Connection reset by peer {INJECTED}")
        loop.call_later(max(at, 0.001), reader.set_exception, error)
    return reader
