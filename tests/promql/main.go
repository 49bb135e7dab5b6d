// promqlcheck parses PromQL the way Prometheus does and prints, per input query, what its selectors match.
//
// Why: the adapter's property tests (tests/integration/test_promql_properties.py) must show that hostile
// metric names, label names, label values and selectors never escape their matcher. A string search cannot
// show that; Prometheus' own parser can. Input: one JSON object per line, {"query": "...", "probes": {"label":
// ["value", ...]}}; output: one JSON object per line, {"error": "..."} or {"selectors": [{"name": "...",
// "matchers": [{"type": "=", "name": "...", "value": "...", "matches": {"<probe>": true}}]}]}: every matcher
// of every vector or matrix selector, with its verdict (Go RE2 semantics for =~ and !~) on the probe values
// given for its label name.
package main

import (
	"bufio"
	"encoding/json"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

type request struct {
	Query  string              `json:"query"`
	Probes map[string][]string `json:"probes"`
}

type matcher struct {
	Type    string          `json:"type"`
	Name    string          `json:"name"`
	Value   string          `json:"value"`
	Matches map[string]bool `json:"matches"`
}

type selector struct {
	Name     string    `json:"name"`
	Matchers []matcher `json:"matchers"`
}

type response struct {
	Error     string     `json:"error,omitempty"`
	Selectors []selector `json:"selectors"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	promql := parser.NewParser(parser.Options{})
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			_ = enc.Encode(response{Error: "bad input: " + err.Error()})
			_ = out.Flush()
			continue
		}
		expr, err := promql.ParseExpr(req.Query)
		if err != nil {
			_ = enc.Encode(response{Error: err.Error()})
			_ = out.Flush()
			continue
		}
		resp := response{Selectors: []selector{}}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			vs, ok := node.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			sel := selector{Name: vs.Name}
			for _, m := range vs.LabelMatchers {
				verdicts := map[string]bool{}
				for _, probe := range req.Probes[m.Name] {
					verdicts[probe] = m.Matches(probe)
				}
				sel.Matchers = append(sel.Matchers, matcher{m.Type.String(), m.Name, m.Value, verdicts})
			}
			resp.Selectors = append(resp.Selectors, sel)
			return nil
		})
		_ = enc.Encode(resp)
		_ = out.Flush() // one answer per question: the caller waits for this line
	}
	if err := in.Err(); err != nil {
		_ = enc.Encode(response{Error: "reading input: " + err.Error()})
		os.Exit(1)
	}
}
