"""Delay levels as RocketMQ 4.4.0 stores them: a message put with the DELAY property (or `with_delay_level`) is
stored on SCHEDULE_TOPIC_XXXX and delivered to its topic when its level's delay has passed.

    format.py    the topic, the properties, the level syntax, the due time in the tag code
    progress.py  config/delayOffset.json (progress per level) and config/delayLevels.json
    service.py   ScheduleService: the put-side rewrite and the writer's delivery thread

The store knows this package through `MessageStore.schedule` (writers only); this package knows the store only as
an argument (max_offset, queue_units, read_at, put, flush). docs/schedule.md is the user's page.
"""

from mqstore.schedule.format import with_delay_level

__all__ = ["with_delay_level"]
