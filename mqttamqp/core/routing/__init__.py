"""Topic routing: the router, shared groups, retained messages and their feed, what
a publish answers, exactly-once QoS 2, settlement, topic statistics."""
