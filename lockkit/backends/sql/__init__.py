"""SQL building shared by the vendor packages: claims statements, SET clauses, table names, relabelled aliases."""
