"""These scripts run as their own processes (tests/test_mooncake.py), not under pytest."""
collect_ignore = ["initiator_test.py", "target.py"]
