"""Models used by lockkit's tests."""

from __future__ import annotations

from django.db import models


class Stock(models.Model):
    sku = models.CharField(max_length=40, primary_key=True)
    available = models.IntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(available__gte=0), name="stock_available_gte_0")
        ]

    def __str__(self) -> str:
        return f"{self.sku}: {self.available}"


class Owner(models.Model):
    name = models.CharField(max_length=40)


class StockProxy(Stock):
    """A proxy: ``save()`` signals name it as their sender."""

    class Meta:
        proxy = True


class AuditedStock(Stock):
    """A proxy that overrides ``save()`` and counts its calls."""

    saves = 0

    class Meta:
        proxy = True

    def save(self, *args: object, **kwargs: object) -> None:
        type(self).saves += 1
        super().save(*args, **kwargs)  # type: ignore[arg-type]


class TalliedStock(models.Model):
    """A model whose ``save()`` first writes another row of its own table: the ``"tally"`` row counts the saves."""

    TALLY = "tally"

    sku = models.CharField(max_length=40, primary_key=True)
    available = models.IntegerField(default=0)

    def save(self, *args: object, **kwargs: object) -> None:
        using = kwargs.get("using") or self._state.db
        assert isinstance(using, str)
        type(self)._base_manager.using(using).filter(pk=self.TALLY).update(
            available=models.F("available") + 1
        )
        super().save(*args, **kwargs)  # type: ignore[arg-type]


class StampedStock(models.Model):
    """A field whose ``pre_save`` sets its value (``auto_now``) and a nullable foreign key."""

    sku = models.CharField(max_length=40, primary_key=True)
    available = models.IntegerField()
    touched = models.DateTimeField(auto_now=True)
    owner = models.ForeignKey(Owner, null=True, on_delete=models.SET_NULL)


class Item(models.Model):
    """A row with a nullable foreign key, for ``select_related`` with ``FOR UPDATE``."""

    name = models.CharField(max_length=40)
    value = models.IntegerField(default=0)
    owner = models.ForeignKey(Owner, null=True, on_delete=models.SET_NULL)


class RemoteItem(models.Model):
    """Routed to the ``other`` database by ``lockkit_tests.routers.TestRouter``."""

    lockkit_alias = "other"

    name = models.CharField(max_length=40)
    value = models.IntegerField(default=0)


# -- The Django parity suite (lockkit_tests/django_parity/): scenarios of Django's select_for_update tests. ------


class PeerEntity(models.Model):
    """The root of a multi-table inheritance chain: ``PeerEntity`` <- ``PeerCountry`` <- ``PeerEUCountry``."""

    code = models.CharField(max_length=8, default="")


class PeerCountry(PeerEntity):
    name = models.CharField(max_length=40)


class PeerEUCountry(PeerCountry):
    joined = models.IntegerField(null=True)


class PeerCountryProxy(PeerCountry):
    class Meta:
        proxy = True


class PeerCity(models.Model):
    name = models.CharField(max_length=40)
    country = models.ForeignKey(PeerCountry, on_delete=models.CASCADE)


class PeerPerson(models.Model):
    """``died`` is nullable: ``select_related("died")`` is an outer join, which ``FOR UPDATE`` cannot lock."""

    name = models.CharField(max_length=40)
    born = models.ForeignKey(PeerCity, on_delete=models.CASCADE, related_name="+")
    died = models.ForeignKey(PeerCity, null=True, on_delete=models.SET_NULL, related_name="+")


class PeerProfile(models.Model):
    person = models.OneToOneField(PeerPerson, on_delete=models.CASCADE, related_name="profile")


class PeerReporter(models.Model):
    first_name = models.CharField(max_length=40)
    last_name = models.CharField(max_length=40, default="")
    rank = models.IntegerField(default=0)


# -- job claims (lockkit.claims) -------------------------------------------------------------------------------------
# Imported here, not at the top: lockkit.claims defines a model mixin, and this module is loaded by the app registry.
from lockkit.claims import Claimable  # noqa: E402


class Job(Claimable):
    """A job row for the claims tests; ``state`` is the job's own state, which lockkit leaves to the caller."""

    name = models.CharField(max_length=40, default="")
    state = models.CharField(max_length=20, default="pending", db_index=True)
    result = models.CharField(max_length=80, default="")


class JobLog(models.Model):
    """The side effect of running a job: one row per completion, at most one per job (the constraint)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE)
    worker = models.CharField(max_length=40)
    token = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job"], name="joblog_one_per_job")]


class JobTag(models.Model):
    """Several tags per job, so a queryset filtered through them yields each job more than once."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=20)


class NotClaimable(models.Model):
    """A model without the mixin, which claims must refuse."""

    state = models.CharField(max_length=20, default="pending")


class UrgentJob(Job):
    """Multi-table inheritance: the claim columns live in the parent's table, so claims must refuse the child."""

    priority = models.IntegerField(default=0)


class CodeJob(Claimable):
    """A job keyed by a short code: fences must compare a ``varchar(12)`` key exactly, never truncated."""

    code = models.CharField(max_length=12, primary_key=True)


class PricedJob(Claimable):
    """A job keyed by a ``numeric(5, 2)``: fences must compare the key exactly, never rounded."""

    price = models.DecimalField(max_digits=5, decimal_places=2, primary_key=True)


class DottedJob(Claimable):
    """A job whose primary-key column has a dot in its name: identifiers come from metadata, never re-parsed."""

    id = models.BigAutoField(primary_key=True, db_column="job.id")
    state = models.CharField(max_length=20, default="pending")


#: The schema of ``QueuedJob``'s table, made by the test that uses it (``claims/test_hardening.py``).
QUEUE_SCHEMA = "lockkit_queue"


class QueuedJob(Claimable):
    """A job table in another schema, named with Django's idiom ``db_table = 'schema"."table'``.

    Unmanaged: the table exists on PostgreSQL only, made (with its schema) by the fixture of the tests using it.
    """

    state = models.CharField(max_length=20, default="pending")

    class Meta:
        managed = False
        db_table = f'{QUEUE_SCHEMA}"."queued_job'


class JobEffect(models.Model):
    """A database effect of running a job, with no uniqueness: the tests count how often each job's was applied."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="effects")
    worker = models.CharField(max_length=40)
    token = models.BigIntegerField()


class RankedJob(Claimable):
    """A job with a nullable priority, for ordering expressions (``F("priority").desc(nulls_last=True)``)."""

    name = models.CharField(max_length=40, default="")
    priority = models.IntegerField(null=True)
    state = models.CharField(max_length=20, default="pending")


class OwnedJob(Claimable):
    """A job with a foreign key, for querysets with ``select_related()`` and model instances in ``set=``."""

    name = models.CharField(max_length=40, default="")
    owner = models.ForeignKey(Owner, null=True, on_delete=models.SET_NULL)

    objects: models.Manager[OwnedJob] = models.Manager()


# -- The documentation's examples (README.md, docs/*.md, run by Sybil): `shop.models.Account` is this model. -----------


class DocAccount(models.Model):
    """A bank account for the transfer examples of the docs (lockkit_tests/support/doc_examples.py maps the names)."""

    owner = models.CharField(max_length=40, default="")
    balance = models.IntegerField(default=0)


# -- composite primary keys (Django 5.2+) -------------------------------------------------------------------------------


class PairJob(Claimable):
    """A job keyed by two columns (``CompositePrimaryKey``): claims refuse it, naming the parameter, before any SQL."""

    pk = models.CompositePrimaryKey("tenant", "number")
    tenant = models.IntegerField()
    number = models.IntegerField()
    state = models.CharField(max_length=20, default="pending")

    # Declared: django-stubs' plugin adds no default manager to a model with a composite primary key.
    objects: models.Manager[PairJob] = models.Manager()


class PairStock(models.Model):
    """A row keyed by two columns, for the scope helpers (``lock``, ``get``, ``lock_all``) and the save warning."""

    pk = models.CompositePrimaryKey("warehouse", "sku")
    warehouse = models.IntegerField()
    sku = models.CharField(max_length=40)
    available = models.IntegerField(default=0)

    objects: models.Manager[PairStock] = models.Manager()
