"""Fuzzing the FlushGate's state machine (commitlog/csrc/flushwait.c): waits, advances, closes and reads from
several threads, in orders and with values taken from the input, against these invariants:

- `durable` never decreases (each thread's reads, in order), and ends at the highest position ever advanced to
  (or the starting one);
- wait() returns DURABLE only for a position at or below `durable`, LEAD to one thread at a time, and after
  close() only DURABLE or CLOSED (a closed gate never reports a position durable that is not);
- out-of-range arguments raise (OverflowError, TypeError), never wrap; every thread finishes.
"""

from __future__ import annotations

import threading

from mqstore.commitlog import native

from fuzz.provider import Input

GATE_DURABLE, GATE_LEAD, GATE_TIMEOUT, GATE_CLOSED, GATE_IDLE = 0, 1, 2, 3, 4  # flush/services.py's names
THREADS_MAX = 4
STEPS_MAX = 10
JOIN_TIMEOUT_S = 20.0  # far beyond any step's timeout: a thread still running then is stuck
TIMEOUTS_S = (0.0, 0.0005, 0.002, -1.0, 1e-9)
POSITIONS_ODD = (-1, -(1 << 63), (1 << 63) - 1, 1 << 63, 1.5, None, "1")


class Run:
    """What the threads saw and did, checked once they finished."""

    def __init__(self, start: int):
        self.lock = threading.Lock()
        self.leader: int | None = None  # the thread holding the lead, as the model has it
        self.closed = False
        self.advanced = [start]
        self.errors: list[str] = []

    def fail(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


def _position(source: Input, base: int):
    kind = source.below(10)
    if kind < 7:
        return base + source.below(1 << 16) - 256
    return source.pick(POSITIONS_ODD)


def _steps(source: Input, base: int) -> list[tuple]:
    steps = []
    for _ in range(source.below(STEPS_MAX) + 1):
        kind = source.below(8)
        if kind < 4:
            steps.append(("wait", _position(source, base), source.pick(TIMEOUTS_S), source.flag()))
        elif kind < 6:
            steps.append(("advance", _position(source, base), source.flag()))
        elif kind == 6:
            steps.append(("read",))
        else:
            steps.append(("close",) if source.below(4) == 0 else ("read",))
    return steps


def _wait(gate, run: Run, me: int, position, timeout_s, lead) -> None:
    closed_before = run.closed
    try:
        outcome = gate.wait(position, timeout_s, lead)
    except (OverflowError, TypeError):
        if isinstance(position, int) and -(1 << 63) <= position < (1 << 63):
            run.fail(f"wait({position}, {timeout_s}, {lead}) raised for an int64 position")
        return
    durable = gate.durable
    if outcome == GATE_DURABLE and position > durable:
        run.fail(f"wait({position}) said durable, durable is {durable}")
    if closed_before and outcome not in (GATE_DURABLE, GATE_CLOSED):
        run.fail(f"wait({position}) on a closed gate gave {outcome}")
    if outcome == GATE_LEAD:
        with run.lock:
            if not lead:
                run.errors.append(f"wait({position}, lead=False) gave the lead")
            if run.leader is not None:
                run.errors.append(f"thread {me} took the lead while thread {run.leader} held it")
            run.leader = me
    elif outcome not in (GATE_DURABLE, GATE_TIMEOUT, GATE_CLOSED, GATE_IDLE):
        run.fail(f"wait gave {outcome}")


def _advance(gate, run: Run, me: int, position, keep) -> None:
    with run.lock:
        if run.leader != me:  # only the leader advances (flush/services.py): the model keeps to that
            return
        run.leader = None  # before the gate lets go: another thread may take the lead at once
    try:
        more = gate.advance(position, keep)
    except (OverflowError, TypeError):
        if isinstance(position, int) and -(1 << 63) <= position < (1 << 63):
            run.fail(f"advance({position}) raised for an int64 position")
        with run.lock:
            run.leader = me  # the gate did nothing: still the leader
        return
    with run.lock:
        run.advanced.append(position)
        if more:  # kept the lead: nobody could take it meanwhile
            run.leader = me
    if more and more <= gate.durable:
        run.fail(f"advance({position}, keep) asked to flush again to {more}, durable is {gate.durable}")


def _thread(gate, run: Run, me: int, steps: list[tuple]) -> None:
    seen = gate.durable
    for step in steps:
        if step[0] == "wait":
            _wait(gate, run, me, *step[1:])
        elif step[0] == "advance":
            _advance(gate, run, me, *step[1:])
        elif step[0] == "close":
            gate.close()
            with run.lock:  # after: no wait can take the lead from a closed gate
                run.closed = True
                run.leader = None
        now = gate.durable
        if now < seen:
            run.fail(f"durable went from {seen} to {now}")
        seen = now
    with run.lock:  # a leader that is done lets go, as flush/services.py's leader does after its rounds
        leading = run.leader == me
    if leading:
        with run.lock:
            run.leader = None
        gate.advance(gate.durable, False)


def one_input(data: bytes) -> None:
    source = Input(data)
    start = source.uint(8) >> source.below(64)
    start = min(start, (1 << 63) - 1)
    gate = native.NATIVE.flush_gate(start)
    run = Run(start)
    plans = [_steps(source, start) for _ in range(source.below(THREADS_MAX) + 1)]
    threads = [threading.Thread(target=_thread, args=(gate, run, me, plan), daemon=True)
               for me, plan in enumerate(plans)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    stuck = [me for me, thread in enumerate(threads) if thread.is_alive()]
    if stuck:
        gate.close()  # let them go before the report
    assert not stuck, f"threads {stuck} still running after {JOIN_TIMEOUT_S} s: {plans}"
    assert not run.errors, f"{run.errors[:3]} in {plans}"
    highest = max(p for p in run.advanced if isinstance(p, int) and -(1 << 63) <= p < (1 << 63))
    assert gate.durable == highest, f"durable {gate.durable}, highest advance {highest}: {plans}"
    assert gate.waiting == 0, f"{gate.waiting} waiting after every thread finished"
