"""Topic routing: the router, retained messages, shared subscriptions, topic statistics."""
