"""Timers in RocketMQ 5's timer-wheel format: a message put with TIMER_DELIVER_MS, TIMER_DELAY_MS or TIMER_DELAY_SEC
is stored on `rmq_sys_wheel_timer` and delivered to its topic when due.

    format.py   the TimerLog unit, the wheel slot, the checkpoint, the property names (OFFSET SIZE TYPE FIELD)
    rewrite.py  the put-side rewrite onto the timer topic (RocketMQ's HookUtils.transformTimerMessage)
    files.py    TimerLog (pwrite/pread), TimerWheel (one mapping), TimerCheckpoint
    service.py  TimerService: the writer's thread that enqueues into the wheel and delivers

The store knows this package through `MessageStore.timer` (a TimerService, writers only); this package knows the
store only as an argument (get, read_at, put, flush). docs/timer.md is the user's page.
"""

from mqstore.timer.rewrite import with_delay

__all__ = ["with_delay"]
