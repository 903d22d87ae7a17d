"""Draining an epoch that may raise on the way, as a loop that catches the
loader's errors and goes on does."""

import stoker


def drain(loader, errors_of=(stoker.DataError,)):
    """Every sample (its value, from batches of values) of an epoch and every
    error's text on the way, carrying on after each."""
    got, errors = [], []
    it = iter(loader)
    while True:
        try:
            got += next(it).tolist()
        except StopIteration:
            return got, errors
        except errors_of as e:
            errors.append(str(e))
