"""Users, user store, ACLs, SASL/SCRAM, bans, admission (kept out of core: they do I/O)."""
