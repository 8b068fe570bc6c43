"""The walrus passes: one module each, with NAME, an Options dataclass if it has options, counters
(ctx.set_stat / ctx.count) and one `run(ctx)` registered by `@register(NAME, Options)`."""
