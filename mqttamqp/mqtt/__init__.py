"""MQTT 3.1 / 3.1.1: a sans-IO codec (``packets``, ``codec``) and a thin Twisted protocol."""
