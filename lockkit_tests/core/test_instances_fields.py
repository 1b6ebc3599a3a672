"""Model instances built from rows lockkit compiled (``lockkit.backends.sql.rows.instances``) follow the model's fields.

The converters are kept per model; the model's own field list is known by its identity. A field added at run time
(``contribute_to_class``, as some libraries do lazily) makes Django build a new list: the converters are built anew
(found by a review helper: the kept ones were used, and the row did not fit them).
"""

from __future__ import annotations

from django.db import models
from django.test.utils import isolate_apps

from lockkit.backends.sql.rows import instances


@isolate_apps("lockkit_tests")
def test_converters_follow_a_field_added_at_run_time() -> None:
    class GrownAtRunTime(models.Model):
        name = models.CharField(max_length=10)

        class Meta:
            app_label = "lockkit_tests"

    (first,) = instances(GrownAtRunTime, "default", [[1, "a"]])
    assert (first.pk, first.name) == (1, "a")
    models.IntegerField(default=0).contribute_to_class(GrownAtRunTime, "size")
    assert len(GrownAtRunTime._meta.concrete_fields) == 3
    (second,) = instances(GrownAtRunTime, "default", [[2, "b", 7]])
    assert (second.pk, second.name, second.__dict__["size"]) == (2, "b", 7)  # added at run time
    # Fields the caller names (in the model's order, as a statement returns them): converted as given.
    named = [field for field in GrownAtRunTime._meta.concrete_fields if field.name in ("id", "name")]
    (third,) = instances(GrownAtRunTime, "default", [[3, "c"]], fields=named)
    assert (third.pk, third.name, third.get_deferred_fields()) == (3, "c", {"size"})
