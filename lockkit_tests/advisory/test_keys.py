"""Advisory-lock keys: validation before any SQL, and a text hash pinned across processes and Python versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connections

from lockkit.advisory.keys import MAX_LOCK_NAME, advisory_key, hash_text
from lockkit_tests.support.vendors import vendor_params

# Values computed once and pinned: a change here means two versions of an application would hold "the same"
# lock at once. Never update them to make a test pass. (They changed once, before the first release, to
# django-pglock's byte order: a str key is the same lock as pglock.advisory(key); see lockkit_tests/pglock_port.)
PINNED: list[tuple[object, int]] = [
    ("hello", 1054880662928880172),
    ("nightly-report", -8663603374018903193),
    ("ключ-🔒", -3760435805994750463),
    (("billing", 42), 7231033311962774890),
    (("tenant-7", "invoice-19"), 3638947811884529973),
    ((1, 2), 4294967298),
    ((-1, -1), -1),
    (2**63 - 1, 2**63 - 1),
    (-(2**63), -(2**63)),
]
KEYS_MODULE = Path(__file__).resolve().parents[2] / "lockkit" / "advisory" / "keys.py"
# Loads the keys module by path (it imports only the standard library), so any Python can run it.
PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("keys", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["keys"] = module
spec.loader.exec_module(module)
keys = [tuple(k) if isinstance(k, list) else k for k in json.loads(sys.argv[2])]
print(json.dumps([module.advisory_key(k).value for k in keys]))
"""


@pytest.mark.parametrize(("key", "value"), PINNED, ids=[repr(k) for k, _ in PINNED])
def test_pinned_values(key: object, value: int) -> None:
    assert advisory_key(key).value == value


def _interpreters() -> list[str]:
    found = [sys.executable]
    for version in ("3.11.7", "3.12.1", "3.13.0"):
        path = f"/root/.pyenv/versions/{version}/bin/python"
        if os.path.exists(path):
            found.append(path)
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_same_values_in_another_process(python: str) -> None:
    keys = [list(k) if isinstance(k, tuple) else k for k, _ in PINNED]
    # PYTHONHASHSEED differs per process: the key must not depend on Python's hash().
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    result = subprocess.run(
        [python, "-c", PROBE, str(KEYS_MODULE), json.dumps(keys, ensure_ascii=False)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    assert json.loads(result.stdout) == [value for _, value in PINNED]


@pytest.mark.django_db(databases=["default"])
def test_postgresql_computes_the_same_hash() -> None:
    texts = ["hello", "nightly-report", "ключ-🔒", '["billing",42]']
    with connections["default"].cursor() as cursor:
        for text in texts:
            cursor.execute(
                # docs/advisory.md's SQL form of the hash: the first 8 bytes, last byte first.
                "SELECT ('x' || string_agg(lpad(to_hex(get_byte(h, i)), 2, '0'), '' ORDER BY i DESC))"
                "::bit(64)::bigint FROM sha256(convert_to(%s, 'UTF8')) AS h, generate_series(0, 7) AS i",
                [text],
            )
            assert cursor.fetchone() == (hash_text(text),)


def test_pair_forms() -> None:
    two_ints = advisory_key((1, 2))
    assert two_ints.pair == (1, 2)
    assert advisory_key((-(2**31), 2**31 - 1)).pair == (-(2**31), 2**31 - 1)
    hashed = advisory_key(("billing", 42))
    assert hashed.pair is None
    assert hashed.value == hash_text('["billing",42]')
    # The pair is not the same key as its parts joined: no accidental sharing of a key.
    assert advisory_key(("a", "b:c")).value != advisory_key(("a:b", "c")).value


@pytest.mark.parametrize(
    ("key", "error", "words"),
    [
        (True, TypeError, "not bool"),
        (1.0, TypeError, "not float"),
        (None, TypeError, "not NoneType"),
        (b"bytes", TypeError, "not bytes"),
        (2**63, ValueError, "signed 64-bit"),
        (-(2**63) - 1, ValueError, "signed 64-bit"),
        ("", ValueError, "empty"),
        ("\ud800", ValueError, "UTF-8"),
        ((1, 2, 3), ValueError, "pair"),
        ((2**31, 0), ValueError, "32-bit"),
        ((0, -(2**31) - 1), ValueError, "32-bit"),
        ((True, 1), TypeError, "namespace"),
        (("ns", 1.5), TypeError, "key of key"),
        (("", "x"), ValueError, "empty"),
    ],
)
def test_bad_keys_are_refused_by_name(key: object, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match="key") as caught:
        advisory_key(key)
    assert words in str(caught.value)


def test_lock_names_fit_get_lock() -> None:
    key = advisory_key("nightly-report")
    assert key.lock_name("test_lk_advisory") == "lockkit:test_lk_advisory:k87c4b2a210ba4367"
    long_name = key.lock_name("d" * 64)
    assert len(long_name) <= MAX_LOCK_NAME
    assert long_name.endswith(":k87c4b2a210ba4367")
    # A pair has a name of its own, so (1, 2) and the int 4294967298 stay apart as they do on PostgreSQL.
    assert advisory_key((1, 2)).lock_name("db") != advisory_key(4294967298).lock_name("db")
    assert advisory_key(-1).lock_name("db") == "lockkit:db:kffffffffffffffff"


# docs/advisory.md's SQL form of a str key's GET_LOCK name on MariaDB/MySQL: the same 64-bit value, in hex.
MARIADB_NAME = (
    "SELECT CONCAT('lockkit:', DATABASE(), ':k', SUBSTR(h, 15, 2), SUBSTR(h, 13, 2), SUBSTR(h, 11, 2), "
    "SUBSTR(h, 9, 2), SUBSTR(h, 7, 2), SUBSTR(h, 5, 2), SUBSTR(h, 3, 2), SUBSTR(h, 1, 2)) "
    "FROM (SELECT SHA2(%s, 256) AS h) AS t"
)


@pytest.mark.parametrize("alias", [p for p in vendor_params() if p.id == "mariadb"])
def test_mariadb_computes_the_same_lock_name(alias: str) -> None:
    connection = connections[alias]
    database = str(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        for text in ["hello", "nightly-report", "ключ-🔒", '["billing",42]']:
            cursor.execute(MARIADB_NAME, [text])
            assert cursor.fetchone() == (advisory_key(text).lock_name(database),)
            cursor.execute("SELECT IS_USED_LOCK(%s) IS NULL", [advisory_key(text).lock_name(database)])
            assert cursor.fetchone() == (1,)
