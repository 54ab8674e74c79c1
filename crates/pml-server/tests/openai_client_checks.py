"""The checks the client scripts share: one printed line per check, the first failure raises."""

import openai


def check(name, condition, detail=""):
    if not condition:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok  {name}")


def expect_error(name, status, param, call):
    try:
        call()
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        check(f"{name}: status {status}", error.status_code == status, error.status_code)
        check(f"{name}: param {param}", body.get("param") == param, body)
        for field in ("message", "type", "param", "code"):
            check(f"{name}: error has `{field}`", field in body, body)
        code = body.get("code")
        check(f"{name}: code is a string or null", code is None or isinstance(code, str), code)
        return body
    raise AssertionError(f"{name}: no error")
