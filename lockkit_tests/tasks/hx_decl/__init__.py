"""Modules of ``@periodic_task`` declarations for the hostile tests (test_hx_*.py): imported only by the worker and
``check`` processes those tests start (``task_modules``), never by the test process.
"""
