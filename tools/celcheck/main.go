// celcheck evaluates a ValidatingAdmissionPolicy's CEL expressions (matchConditions, variables,
// validations) against admission requests, with cel-go: the CEL implementation the Kubernetes API
// server compiles these expressions with. The tests feed it the policy gpulens ships and the Jobs
// the receiver builds (plus Jobs a stolen token might send), so the policy is judged by a real CEL
// evaluator rather than a reading of it. What it does not do: type-check against the API server's
// OpenAPI schemas (objects are dynamic maps here) or add Kubernetes' own CEL libraries (quantity,
// url, ...), which the policy does not use; an expression that needs them fails to compile here.
//
// stdin:  {"policy": <ValidatingAdmissionPolicy>, "cases": [{"name", "object", "request"}]}
// stdout: [{"name", "matched", "denied": [messages], "error": ""}]
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

type expression struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
	Message    string `json:"message"`
}

type policy struct {
	Spec struct {
		MatchConditions []expression `json:"matchConditions"`
		Variables       []expression `json:"variables"`
		Validations     []expression `json:"validations"`
	} `json:"spec"`
}

type input struct {
	Policy policy `json:"policy"`
	Cases  []struct {
		Name    string         `json:"name"`
		Object  map[string]any `json:"object"`
		Request map[string]any `json:"request"`
	} `json:"cases"`
}

type verdict struct {
	Name    string   `json:"name"`
	Matched bool     `json:"matched"`
	Denied  []string `json:"denied"`
	Error   string   `json:"error"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fail("stdin: %v", err)
	}
	env, err := cel.NewEnv(
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("request", cel.DynType),
		cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		fail("cel env: %v", err)
	}
	compile := func(e expression) cel.Program {
		ast, issues := env.Compile(e.Expression)
		if issues != nil && issues.Err() != nil {
			fail("%q: %v", e.Expression, issues.Err())
		}
		program, err := env.Program(ast)
		if err != nil {
			fail("%q: %v", e.Expression, err)
		}
		return program
	}
	spec := in.Policy.Spec
	out := []verdict{}
	for _, c := range in.Cases {
		v := verdict{Name: c.Name, Denied: []string{}}
		bindings := map[string]any{
			"object": c.Object, "oldObject": nil, "request": c.Request, "variables": map[string]any{},
		}
		eval := func(e expression) (ref.Val, error) {
			value, _, err := compile(e).Eval(bindings)
			return value, err
		}
		v.Matched = true
		for _, m := range spec.MatchConditions {
			value, err := eval(m)
			if err != nil {
				v.Error = fmt.Sprintf("matchCondition %s: %v", m.Name, err)
				break
			}
			if value != types.True {
				v.Matched = false
			}
		}
		if v.Matched && v.Error == "" {
			variables := map[string]any{}
			for _, variable := range spec.Variables {
				value, err := eval(variable)
				if err != nil {
					v.Error = fmt.Sprintf("variable %s: %v", variable.Name, err)
					break
				}
				variables[variable.Name] = value
				bindings["variables"] = variables
			}
			for _, validation := range spec.Validations {
				if v.Error != "" {
					break
				}
				value, err := eval(validation)
				if err != nil { // the API server denies on an evaluation error under failurePolicy Fail
					v.Denied = append(v.Denied, fmt.Sprintf("%s (error: %v)", validation.Message, err))
				} else if value != types.True {
					v.Denied = append(v.Denied, validation.Message)
				}
			}
		}
		out = append(out, v)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("stdout: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "celcheck: "+format+"\n", args...)
	os.Exit(2)
}
