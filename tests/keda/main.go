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
	"sort"
	"strings"
	"sync"
	"syscall"
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
	// Op "load": TriggerType (external or prometheus), Objects scalers, Rounds calls each, Workers at once.
	TriggerType string `json:"triggerType"`
	Objects     int    `json:"objects"`
	Rounds      int    `json:"rounds"`
	Workers     int    `json:"workers"`
	// Namespaces: in metadata values, "{i}" becomes the object's index (%04d) and "{ns}" its namespace
	// index, i % Namespaces (%03d), so each ScaledObject reads its own workload.
	Namespaces int `json:"namespaces"`
}

type loadResult struct {
	ID          string         `json:"id"`
	Calls       int            `json:"calls"`
	Errors      int            `json:"errors"`
	FirstError  string         `json:"firstError,omitempty"`
	Values      map[string]int `json:"values"`
	P50Millis   float64        `json:"p50Millis"`
	P99Millis   float64        `json:"p99Millis"`
	WallSeconds float64        `json:"wallSeconds"`
	CPUSeconds  float64        `json:"cpuSeconds"`
	// PerObject: each object's last value, by object index.
	PerObject map[string]string `json:"perObject"`
}

func expand(metadata map[string]string, i, namespaces int) map[string]string {
	out := make(map[string]string, len(metadata))
	for k, v := range metadata {
		v = strings.ReplaceAll(v, "{i}", fmt.Sprintf("%04d", i))
		out[k] = strings.ReplaceAll(v, "{ns}", fmt.Sprintf("%03d", i%max(namespaces, 1)))
	}
	return out
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
	// StreamedSpecs: the HPA metric specs KEDA built from each StreamMetricSpec message (push only).
	StreamedSpecs [][]spec `json:"streamedSpecs,omitempty"`
	Calls  int     `json:"calls"`
	Millis float64 `json:"millis"`
}

func config(c testCase) *scalersconfig.ScalerConfig {
	triggerType := c.TriggerType
	if triggerType == "" {
		triggerType = "external"
	}
	return &scalersconfig.ScalerConfig{
		GlobalHTTPTimeout:       3 * time.Second, // KEDA_HTTP_DEFAULT_TIMEOUT's default
		ScalableObjectName:      c.Name,
		ScalableObjectNamespace: c.Namespace,
		ScalableObjectType:      "ScaledObject",
		TriggerIndex:            c.TriggerIndex,
		TriggerType:             triggerType,
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
	var streamed sync.WaitGroup
	if streamer, ok := s.(interface{ MetricSpecChan() <-chan []v2.MetricSpec }); ok {
		// KEDA v2.21 runs StreamMetricSpec beside StreamIsActive and hands each update to the operator
		// through this channel (closed when the stream ends for good or Run returns)
		specs := streamer.MetricSpecChan()
		streamed.Add(1)
		go func() {
			defer streamed.Done()
			for {
				select {
				case got, open := <-specs:
					if !open {
						return
					}
					r.StreamedSpecs = append(r.StreamedSpecs, specsOf(got))
				case <-runCtx.Done():
					return
				}
			}
		}()
	}
	go s.Run(runCtx, active)
	for v := range active {
		r.Pushed = append(r.Pushed, v)
		r.Active = v
	}
	streamed.Wait()
	return r
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func load(ctx context.Context, c testCase) loadResult {
	r := loadResult{ID: c.ID, Values: map[string]int{}, PerObject: map[string]string{}}
	scalerList := make([]scalers.Scaler, 0, c.Objects)
	names := make([]string, 0, c.Objects)
	for i := 0; i < c.Objects; i++ {
		oc := c
		oc.Name = fmt.Sprintf("%s-%d", c.Name, i)
		oc.Metadata = expand(c.Metadata, i, c.Namespaces)
		var s scalers.Scaler
		var err error
		if c.TriggerType == "prometheus" {
			s, err = scalers.NewPrometheusScaler(config(oc))
		} else {
			s, err = scalers.NewExternalScaler(config(oc))
		}
		if err != nil {
			r.Errors++
			r.FirstError = err.Error()
			return r
		}
		defer s.Close(ctx)
		specs := s.GetMetricSpecForScaling(ctx)
		if len(specs) == 0 || specs[0].External == nil {
			r.Errors++
			r.FirstError = "no metric spec"
			return r
		}
		scalerList = append(scalerList, s)
		names = append(names, specs[0].External.Metric.Name)
	}
	type job struct{ i int }
	jobs := make(chan job)
	var mu sync.Mutex
	latencies := make([]float64, 0, c.Objects*c.Rounds)
	cpu0, began := cpuSeconds(), time.Now()
	var wg sync.WaitGroup
	for w := 0; w < max(c.Workers, 1); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				t0 := time.Now()
				values, _, err := scalerList[j.i].GetMetricsAndActivity(ctx, names[j.i])
				ms := float64(time.Since(t0).Microseconds()) / 1000
				mu.Lock()
				r.Calls++
				latencies = append(latencies, ms)
				if err != nil {
					r.Errors++
					if r.FirstError == "" {
						r.FirstError = err.Error()
					}
				} else if len(values) > 0 {
					r.Values[values[0].Value.String()]++
					r.PerObject[fmt.Sprint(j.i)] = values[0].Value.String()
				}
				mu.Unlock()
			}
		}()
	}
	for round := 0; round < c.Rounds; round++ {
		for i := range scalerList {
			jobs <- job{i}
		}
	}
	close(jobs)
	wg.Wait()
	r.WallSeconds = time.Since(began).Seconds()
	r.CPUSeconds = cpuSeconds() - cpu0
	sort.Float64s(latencies)
	if n := len(latencies); n > 0 {
		r.P50Millis = latencies[n/2]
		r.P99Millis = latencies[min(n-1, n*99/100)]
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
		var r any
		switch c.Op {
		case "push":
			r = push(ctx, c)
		case "load":
			r = load(ctx, c)
		default:
			r = poll(ctx, c)
		}
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "kedaclient: %v\n", err)
			os.Exit(1)
		}
	}
}
