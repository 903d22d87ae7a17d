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


def take_all(loader):
    """Every batch of an epoch as it came, and every DataError on the way
    (the exceptions), carrying on after each."""
    got, errors = [], []
    it = iter(loader)
    while True:
        try:
            got.append(next(it))
        except StopIteration:
            return got, errors
        except stoker.DataError as e:
            errors.append(e)
