"""Durable queues: the queue manager and its memory budget."""
