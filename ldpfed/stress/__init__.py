"""The server's stress tests, run by jobs/stress_server.py: exactness under load and attack (`exactness`),
poisoning within the domain (`poisoning`), the open-loop capacity curve (`capacity`). The Ray parts are imported
only by the modules that need them (`shard`, `exactness`, `capacity`)."""
