"""Clients: the session registry, the gate (admission, bans, authentication), the
gateway's sessions, connections, wills, drop counts and client debug lines."""
