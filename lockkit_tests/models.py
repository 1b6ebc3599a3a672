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
