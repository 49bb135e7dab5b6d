// Command kedaclient drives KEDA's own external-scaler client (github.com/kedacore/keda/v2/pkg/scalers,
// NewExternalScaler / NewExternalPushScaler) against a gpuwarden adapter's gRPC external scaler, the way
// the KEDA operator does: GetMetricSpecForScaling, GetMetricsAndActivity("s<i>-<name>") and Run for
// external-push. It reads a JSON script on stdin and prints one JSON result per case on stdout, so the
// Python integration test (tests/integration/test_keda_scaler.py) asserts on what KEDA itself computed:
// HPA target quantities, metric quantities, activity and errors.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	v2 "k8s.io/api/autoscaling/v2"

	"github.com/kedacore/keda/v2/pkg/scalers"
	"github.com/kedacore/keda/v2/pkg/scalers/scalersconfig"
)

type testCase struct {
	ID           string            `json:"id"`
	Name         string            `json:"name"`
	Namespace    string            `json:"namespace"`
	TriggerIndex int               `json:"triggerIndex"`
	MetricType   string            `json:"metricType"`
	Metadata     map[string]string `json:"metadata"`
	AuthParams   map[string]string `json:"authParams"`
	// Op: "poll" (GetMetricSpecForScaling + GetMetricsAndActivity) or "push" (Run for PushSeconds).
	Op          string  `json:"op"`
	PushSeconds float64 `json:"pushSeconds"`
	// Repeat: GetMetricsAndActivity calls in a row (load); only the last result is reported.
	Repeat int `json:"repeat"`
}

type spec struct {
	Name         string `json:"name"`
	TargetType   string `json:"targetType"`
	AverageValue string `json:"averageValue,omitempty"`
	Value        string `json:"value,omitempty"`
}

type value struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type result struct {
	ID     string  `json:"id"`
	Specs  []spec  `json:"specs"`
	Values []value `json:"values"`
	Active bool    `json:"active"`
	Error  string  `json:"error,omitempty"`
	Pushed []bool  `json:"pushed,omitempty"`
	Calls  int     `json:"calls"`
	Millis float64 `json:"millis"`
}

func config(c testCase) *scalersconfig.ScalerConfig {
	return &scalersconfig.ScalerConfig{
		ScalableObjectName:      c.Name,
		ScalableObjectNamespace: c.Namespace,
		ScalableObjectType:      "ScaledObject",
		TriggerIndex:            c.TriggerIndex,
		TriggerType:             "external",
		MetricType:              v2.MetricTargetType(c.MetricType),
		TriggerMetadata:         c.Metadata,
		AuthParams:              c.AuthParams,
		ResolvedEnv:             map[string]string{},
	}
}

func specsOf(in []v2.MetricSpec) []spec {
	out := []spec{}
	for _, s := range in {
		if s.External == nil {
			continue
		}
		o := spec{Name: s.External.Metric.Name, TargetType: string(s.External.Target.Type)}
		if s.External.Target.AverageValue != nil {
			o.AverageValue = s.External.Target.AverageValue.String()
		}
		if s.External.Target.Value != nil {
			o.Value = s.External.Target.Value.String()
		}
		out = append(out, o)
	}
	return out
}

func poll(ctx context.Context, c testCase) result {
	r := result{ID: c.ID, Specs: []spec{}, Values: []value{}}
	s, err := scalers.NewExternalScaler(config(c))
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer s.Close(ctx)
	r.Specs = specsOf(s.GetMetricSpecForScaling(ctx))
	if len(r.Specs) == 0 {
		r.Error = "GetMetricSpecForScaling returned no metric spec"
		return r
	}
	repeat := max(c.Repeat, 1)
	began := time.Now()
	for i := 0; i < repeat; i++ {
		values, active, err := s.GetMetricsAndActivity(ctx, r.Specs[0].Name)
		r.Calls++
		r.Values, r.Active, r.Error = []value{}, active, ""
		if err != nil {
			r.Error = err.Error()
			continue
		}
		for _, v := range values {
			r.Values = append(r.Values, value{Name: v.MetricName, Value: v.Value.String()})
		}
	}
	r.Millis = float64(time.Since(began).Microseconds()) / 1000
	return r
}

func push(ctx context.Context, c testCase) result {
	r := result{ID: c.ID, Specs: []spec{}, Values: []value{}, Pushed: []bool{}}
	s, err := scalers.NewExternalPushScaler(config(c))
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer s.Close(ctx)
	runCtx, cancel := context.WithTimeout(ctx, time.Duration(c.PushSeconds*float64(time.Second)))
	defer cancel()
	active := make(chan bool)
	go s.Run(runCtx, active)
	for v := range active {
		r.Pushed = append(r.Pushed, v)
		r.Active = v
	}
	return r
}

func main() {
	var script struct {
		Cases []testCase `json:"cases"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&script); err != nil {
		fmt.Fprintf(os.Stderr, "kedaclient: bad script on stdin: %v\n", err)
		os.Exit(2)
	}
	ctx := context.Background()
	enc := json.NewEncoder(os.Stdout)
	for _, c := range script.Cases {
		var r result
		switch c.Op {
		case "push":
			r = push(ctx, c)
		default:
			r = poll(ctx, c)
		}
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "kedaclient: %v\n", err)
			os.Exit(1)
		}
	}
}
