"""The rows the Django parity suite starts from: those of Django's own select_for_update tests."""

from __future__ import annotations

from dataclasses import dataclass

from lockkit_tests.models import PeerCity, PeerCountry, PeerEUCountry, PeerPerson, PeerProfile


@dataclass
class World:
    """Two countries (one of them an EU country, three tables deep), two cities, a person and a profile."""

    alias: str
    country: PeerCountry
    eu_country: PeerEUCountry
    city1: PeerCity
    city2: PeerCity
    person: PeerPerson
    profile: PeerProfile


def make_world(alias: str) -> World:
    country = PeerCountry.objects.using(alias).create(name="Belgium", code="BE")
    eu_country = PeerEUCountry.objects.using(alias).create(name="France", code="FR", joined=1957)
    city1 = PeerCity.objects.using(alias).create(name="Liberchies", country=country)
    city2 = PeerCity.objects.using(alias).create(name="Samois-sur-Seine", country=eu_country)
    person = PeerPerson.objects.using(alias).create(name="Reinhardt", born=city1, died=city2)
    profile = PeerProfile.objects.using(alias).create(person=person)
    return World(alias, country, eu_country, city1, city2, person, profile)
