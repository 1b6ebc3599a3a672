"""The table of SQLSTATEs and vendor error codes, and the translator of database errors into lockkit's typed errors."""
