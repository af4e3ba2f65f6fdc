"""The inference seam every backend shares: request and event types, the tokenizer, the chat
formats, the direct channel to a replica, routing, Serve's custom autoscaling; the emulated
backend is :mod:`inference.emulator`."""
