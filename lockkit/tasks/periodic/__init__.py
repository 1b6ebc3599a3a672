"""Periodic tasks: cron schedules fired by the workers, once per tick.

The schedules are in ``TASKS[...]["OPTIONS"]["periodic"]`` or declared by ``@periodic_task``. ``schedules.py``
checks them, ``declared.py`` is the decorator and finds its declarations, ``models.py`` keeps each schedule's last
tick, ``firing.py`` is the worker's hook, ``admin.py`` lists the schedules. See docs/tasks.md, "Periodic tasks".
"""
