"""The one error type a user sees: a single line saying what is wrong and how to fix it."""


class UserError(ValueError):
  """Bad input from the user (flags, specs, data paths).

  Entry points print `error: <message>` and exit with status 2, no traceback.
  """
