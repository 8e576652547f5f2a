"""The one error a classifier raises at load time (re-exported by classify.build)."""


class ClassifierLoadError(Exception):
    """A classifier cannot be built: missing, corrupt or mismatched model file, bad settings.

    The message is written for the person editing the policy; the gateway shows it as a
    policy-load error and keeps serving the previous policy.
    """
