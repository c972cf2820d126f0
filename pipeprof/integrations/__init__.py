"""pipeprof inside the tools people train with (docs/integrations.md); each module imports its
tool only when it is used."""
