"""The summary of repeated rounds: the median, which a slow drift of the machine between rounds
moves least, with the min and max kept so that the spread stays visible."""

import statistics


def spread(values):
    """{"median", "min", "max", "n"} of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}
