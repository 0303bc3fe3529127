"""Chaos scenarios: ranks killed, stopped, leaving, disagreeing, and strangers on the node."""
