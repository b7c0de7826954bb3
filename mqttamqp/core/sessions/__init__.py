"""Session state: what a client is subscribed to and what waits for it, and its flow."""
