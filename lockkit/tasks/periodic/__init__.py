"""Periodic tasks: cron schedules in ``TASKS[...]["OPTIONS"]["periodic"]``, fired by the workers, once per tick.

``schedules.py`` checks the setting, ``models.py`` keeps each schedule's last tick, ``firing.py`` is the worker's
hook, ``admin.py`` lists the schedules. See docs/tasks.md, "Periodic tasks".
"""
