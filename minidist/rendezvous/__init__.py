"""Rendezvous: rank assignment, a small key/value store, and liveness (server and client)."""
