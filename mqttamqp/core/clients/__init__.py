"""Clients: the session registry, connections, wills and client debug lines."""
