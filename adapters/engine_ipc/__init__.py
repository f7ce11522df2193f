"""The engine-process transport: API processes reach one engine process over a unix socket."""
