"""What every layer shares: Stats, the recorder that times stages, the Session (the data-only,
saveable record of a profile), sampled series, batch counting, region classes, number formats
and framework detection. Imports nothing else of pipeprof."""
