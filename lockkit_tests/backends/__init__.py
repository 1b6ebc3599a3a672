"""The vendor backends: the SQLSTATE/vendor code table, MariaDB and SQLite specifics, the capability report."""
