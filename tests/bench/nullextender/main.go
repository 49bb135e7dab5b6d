// Command nullextender is the floor of the kube-scheduler extender protocol for gpuwarden's benchmark: it
// answers filter with every node it is given, prioritize with zeros, preempt with the candidates as sent,
// and binds with a plain Binding (no claim, no watch, no model). It speaks the same wire format over the
// same transport as gpuwarden's extender (nodeCacheCapable JSON over HTTP/1.1 from kube-scheduler), so the
// difference in pods/s and CPU per pod between the two is what gpuwarden adds. Written for the bench only;
// standard library only, so it builds offline in seconds.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"
)

type filterArgs struct {
	NodeNames *[]string
}

type filterResult struct {
	Nodes                      *json.RawMessage
	NodeNames                  []string
	FailedNodes                map[string]string
	FailedAndUnresolvableNodes map[string]string
	Error                      string
}

type hostPriority struct {
	Host  string
	Score int64
}

type preemptArgs struct {
	NodeNameToMetaVictims map[string]json.RawMessage
}

type preemptResult struct {
	NodeNameToMetaVictims map[string]json.RawMessage
}

type bindArgs struct {
	PodName      string
	PodNamespace string
	PodUID       string
	Node         string
}

type bindResult struct {
	Error string
}

type binder struct {
	server string
	client *http.Client
}

func (b *binder) bind(a bindArgs) error {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Binding",
		"metadata":   map[string]any{"name": a.PodName, "namespace": a.PodNamespace, "uid": a.PodUID},
		"target":     map[string]any{"apiVersion": "v1", "kind": "Node", "name": a.Node},
	})
	if err != nil {
		return err
	}
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding", b.server, a.PodNamespace, a.PodName)
	resp, err := b.client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("binding %s/%s to %s: HTTP %d: %s", a.PodNamespace, a.PodName, a.Node, resp.StatusCode, text)
	}
	return nil
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		log.Printf("write: %v", err)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	prefix := flag.String("prefix", "/gpuwarden", "URL prefix of the verbs")
	server := flag.String("server", "", "kube-apiserver URL (for bind)")
	caFile := flag.String("ca", "", "kube-apiserver CA (PEM)")
	certFile := flag.String("cert", "", "client certificate (PEM)")
	keyFile := flag.String("key", "", "client key (PEM)")
	flag.Parse()

	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			log.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tlsConfig.RootCAs = pool
	}
	if *certFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatal(err)
		}
		tlsConfig.Certificates = []tls.Certificate{pair}
	}
	transport := &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64}
	b := &binder{server: strings.TrimRight(*server, "/"), client: &http.Client{Transport: transport, Timeout: 30 * time.Second}}

	base := "/" + strings.Trim(*prefix, "/")
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+base+"/filter", func(w http.ResponseWriter, r *http.Request) {
		var a filterArgs
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		names := []string{}
		if a.NodeNames != nil {
			names = *a.NodeNames
		}
		reply(w, filterResult{NodeNames: names, FailedNodes: map[string]string{}, FailedAndUnresolvableNodes: map[string]string{}})
	})
	mux.HandleFunc("POST "+base+"/prioritize", func(w http.ResponseWriter, r *http.Request) {
		var a filterArgs
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out := []hostPriority{}
		if a.NodeNames != nil {
			out = make([]hostPriority, 0, len(*a.NodeNames))
			for _, n := range *a.NodeNames {
				out = append(out, hostPriority{Host: n})
			}
		}
		reply(w, out)
	})
	mux.HandleFunc("POST "+base+"/preempt", func(w http.ResponseWriter, r *http.Request) {
		var a preemptArgs
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reply(w, preemptResult(a))
	})
	mux.HandleFunc("POST "+base+"/bind", func(w http.ResponseWriter, r *http.Request) {
		var a bindArgs
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := b.bind(a); err != nil {
			reply(w, bindResult{Error: err.Error()})
			return
		}
		reply(w, bindResult{})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("null extender on %s%s", *listen, base)
	log.Fatal(srv.ListenAndServe())
}
