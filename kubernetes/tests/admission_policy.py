"""Evaluates a ValidatingAdmissionPolicy's CEL on admission requests, as the API server would.

    admission_policy.py POLICY_YAML < cases.json > results.json

cases: [{"name", "request": {...}, "object": {...} | null, "oldObject": {...} | null}]. For each case the policy's
match (namespace labels, resource and operation) is checked, its variables are computed in order into `variables`,
and each validation's expression is evaluated; results: [{"name", "matched", "allowed", "message"}]. The CEL is
cel-python's (Google's Common Expression Language); Kubernetes' string extensions used only in a
messageExpression (`lowerAscii`) are provided here.
"""

import json
import sys

import celpy
import yaml
from celpy import celtypes


def lower_ascii(s):
    return celtypes.StringType(str(s).lower())


def evaluate(env, text, activation):
    program = env.program(env.compile(text), functions={"lowerAscii": lower_ascii})
    return program.evaluate(activation)


def matches(policy, request, namespace_labels):
    constraints = policy["spec"]["matchConstraints"]
    wanted = constraints.get("namespaceSelector", {}).get("matchLabels", {})
    if any(namespace_labels.get(k) != v for k, v in wanted.items()):
        return False
    for rule in constraints["resourceRules"]:
        if (request["resource"]["group"] in rule["apiGroups"] and request["resource"]["resource"] in rule["resources"]
                and request["operation"] in rule["operations"]):
            return True
    return False


def main():
    with open(sys.argv[1]) as f:
        policy = next(d for d in yaml.safe_load_all(f) if d["kind"] == "ValidatingAdmissionPolicy")
    env = celpy.Environment()
    results = []
    for case in json.load(sys.stdin):
        result = {"name": case["name"], "matched": False, "allowed": True, "message": None}
        if matches(policy, case["request"], case.get("namespaceLabels", {})):
            result["matched"] = True
            activation = {
                "request": celpy.json_to_cel(case["request"]),
                "object": celpy.json_to_cel(case.get("object")),
                "oldObject": celpy.json_to_cel(case.get("oldObject")),
            }
            variables = celtypes.MapType({})
            for v in policy["spec"].get("variables", []):
                activation["variables"] = variables
                variables = celtypes.MapType({**variables, celtypes.StringType(v["name"]): evaluate(env, v["expression"], activation)})
            activation["variables"] = variables
            for rule in policy["spec"]["validations"]:
                ok = evaluate(env, rule["expression"], activation)
                if isinstance(ok, Exception):
                    # An expression that fails to evaluate: the policy's failurePolicy (Fail) refuses the request.
                    result["allowed"] = False
                    result["message"] = f"error: {ok}"
                    break
                if not bool(ok):
                    result["allowed"] = False
                    result["message"] = str(evaluate(env, rule["messageExpression"], activation))
                    break
        results.append(result)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
