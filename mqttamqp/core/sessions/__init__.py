"""Session state: what a client is subscribed to and what waits for it, its in-flight
window, its entries, and its flow."""
