"""A precise wake-up on the event loop itself: a ``timerfd`` the loop watches.

The event loop's own timers fire up to a millisecond late: its selector waits in whole
milliseconds, rounded up (``epoll_wait``).  A readable file descriptor wakes it at once, so
an :class:`Alarm` keeps one kernel timer per loop (Linux ``timerfd``, microsecond
precision, no thread) armed for the earliest pending deadline, and resolves the sleeps then
due when the loop sees it fire (``loop.add_reader``).  Where ``timerfd`` is missing
(not Linux), :func:`alarm_for` returns ``None`` and callers use the loop's timers.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import time
import weakref

_CLOCK_MONOTONIC = 1  # the clock of time.monotonic() on Linux
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        )
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class Alarm:
    """One loop's kernel timer and the deadlines (``time.monotonic()`` seconds) waiting on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL) -> None:
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._libc = libc
        self._fd = fd
        self._due: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._armed: float | None = None  # the deadline the kernel timer is set for
        loop.add_reader(fd, self._fire)
        weakref.finalize(loop, os.close, fd)

    def wait(self, delay_s: float) -> asyncio.Future[None]:
        """A future resolved by the loop ``delay_s`` from now (at once if not positive)."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        t = time.monotonic() + delay_s
        heapq.heappush(self._due, (t, next(self._order), woken))
        if self._armed is None or t < self._armed:
            self._arm(t)
        return woken

    def _arm(self, t: float) -> None:
        delay = max(t - time.monotonic(), 1e-6)  # 0 would disarm it
        spec = _Itimerspec()
        spec.it_value.tv_sec = int(delay)
        spec.it_value.tv_nsec = int((delay - int(delay)) * 1e9)
        if self._libc.timerfd_settime(self._fd, 0, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed = t

    def _fire(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count: reading it clears the fd's readiness
        except BlockingIOError:
            pass
        self._armed = None
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, _, woken = heapq.heappop(self._due)
            if not woken.done():  # not cancelled meanwhile
                woken.set_result(None)
        if self._due:
            self._arm(self._due[0][0])


_ALARMS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Alarm] = weakref.WeakKeyDictionary()


def alarm_for(loop: asyncio.AbstractEventLoop) -> Alarm | None:
    """The running loop's :class:`Alarm` (made on first use), or ``None`` without ``timerfd``."""
    if _LIBC is None:
        return None
    alarm = _ALARMS.get(loop)
    if alarm is None:
        alarm = _ALARMS[loop] = Alarm(loop, _LIBC)
    return alarm
