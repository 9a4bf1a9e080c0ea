// Command informer-controller is the benchmark's client-go baseline: the obvious
// controller anyone would write with client-go for the same job as config-watcher.
// A shared informer caches the ConfigMaps of one namespace; UpdateFunc compares
// data and binaryData and, when they changed and the ConfigMap carries the selector
// annotation, lists the matching pods through the clientset and deletes each one.
// With INFORMER_SECRETS=true a second informer does the same for the namespace's
// Secrets (data), as a client-go controller that watches both kinds would.
//
// It is deliberately plain (no workqueue, no exactly-once record, no UID
// precondition): what a competent first version looks like. It talks to the API
// server through the same kubectl proxy as config-watcher (rest.Config{Host: API_URL}).
//
// Settings (environment): WATCH_NAMESPACE (default; * for all), API_URL (http://localhost:8001),
// SELECTOR_ANNOTATION (k8spatterns.io/podDeleteSelector), HTTP_ADDR (:8080; serves
// /readyz: 200 once the informer has synced, so start time is measured as for
// config-watcher), INFORMER_JSON (true: read JSON instead of client-go's default
// protobuf, to tell the wire format's share of the start), INFORMER_SECRETS (false:
// true caches and acts on Secrets too; /readyz then waits for both informers).
//
// With INFORMER_POD_CACHE=true a third informer caches the namespace's pods, and
// the handler takes the pods to delete from that cache (a lister) instead of a
// LIST: the client-go way to keep the API server's consistent reads off the path.
//
// The Secret informer lists every Secret, Helm's release Secrets included: no field
// selector, as the obvious controller has none.
package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func main() {
	ns := env("WATCH_NAMESPACE", "default")
	if ns == "*" {
		ns = metav1.NamespaceAll // as config-watcher: every namespace
	}
	apiURL := env("API_URL", "http://localhost:8001")
	annotation := env("SELECTOR_ANNOTATION", "k8spatterns.io/podDeleteSelector")
	httpAddr := env("HTTP_ADDR", ":8080")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// client-go's defaults (QPS 5, burst 10) would throttle the burst test to
	// 5 requests/s; an operator would raise them, so do we.
	rc := &rest.Config{Host: apiURL, QPS: 100, Burst: 200}
	if os.Getenv("INFORMER_JSON") == "true" {
		// client-go's core clients prefer protobuf; JSON is what config-watcher reads.
		rc.ContentType = "application/json"
		rc.AcceptContentTypes = "application/json"
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		log.Fatalf("clientset: %v", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	var synced []cache.InformerSynced
	// pods lists the pods a selector matches: through the clientset, or from the cache.
	pods := func(ctx context.Context, ns string, sel labels.Selector) ([]corev1.Pod, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return nil, err
		}
		return l.Items, nil
	}
	if os.Getenv("INFORMER_POD_CACHE") == "true" {
		inf := factory.Core().V1().Pods()
		synced = append(synced, inf.Informer().HasSynced)
		pods = func(_ context.Context, ns string, sel labels.Selector) ([]corev1.Pod, error) {
			cached, err := inf.Lister().Pods(ns).List(sel)
			items := make([]corev1.Pod, len(cached))
			for i, p := range cached {
				items[i] = *p
			}
			return items, err
		}
	}
	synced = append(synced, watchKind(ctx, cs, pods, factory.Core().V1().ConfigMaps().Informer(), "configmap", annotation,
		func(oldObj, newObj *corev1.ConfigMap) bool {
			return reflect.DeepEqual(oldObj.Data, newObj.Data) && reflect.DeepEqual(oldObj.BinaryData, newObj.BinaryData)
		}))
	if os.Getenv("INFORMER_SECRETS") == "true" {
		synced = append(synced, watchKind(ctx, cs, pods, factory.Core().V1().Secrets().Informer(), "secret", annotation,
			func(oldObj, newObj *corev1.Secret) bool { return reflect.DeepEqual(oldObj.Data, newObj.Data) }))
	}
	hasSynced := func() bool {
		for _, s := range synced {
			if !s() {
				return false
			}
		}
		return true
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !hasSynced() {
			http.Error(w, "not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	srv := &http.Server{Addr: httpAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
			log.Fatalf("http: %v", err)
		}
	}()

	log.Printf("starting: namespace %s, api %s, secrets %t", ns, apiURL, len(synced) > 1)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	log.Printf("synced")
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	factory.Shutdown()
}

// watchKind restarts the selected pods when an annotated object of one kind (a
// ConfigMap, a Secret) changes, as sameData tells, and returns the informer's
// HasSynced.
func watchKind[T interface {
	*corev1.ConfigMap | *corev1.Secret
	metav1.Object
}](ctx context.Context, cs kubernetes.Interface, pods podsFunc, inf cache.SharedIndexInformer, kind, annotation string, sameData func(oldObj, newObj T) bool) cache.InformerSynced {
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(T)
			n, ok2 := newObj.(T)
			if !ok1 || !ok2 {
				return
			}
			sel, ok := n.GetAnnotations()[annotation]
			if !ok || sel == "" || sameData(o, n) {
				return
			}
			restart(ctx, cs, pods, n.GetNamespace(), kind+" "+n.GetName(), sel)
		},
	})
	if err != nil {
		log.Fatalf("add %s handler: %v", kind, err)
	}
	return inf.HasSynced
}

// podsFunc lists the pods of ns that sel matches.
type podsFunc func(ctx context.Context, ns string, sel labels.Selector) ([]corev1.Pod, error)

// restart deletes the pods selector matches. Called from the informer's handler
// goroutine, so events are handled one at a time, in order.
func restart(ctx context.Context, cs kubernetes.Interface, list podsFunc, ns, obj, selector string) {
	sel, err := labels.Parse(selector)
	if err != nil {
		log.Printf("%s: selector %q: %v", obj, selector, err)
		return
	}
	pods, err := list(ctx, ns, sel)
	if err != nil {
		log.Printf("%s: list pods %q: %v", obj, selector, err)
		return
	}
	for _, p := range pods {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			log.Printf("%s: delete pod %s: %v", obj, p.Name, err)
			continue
		}
		log.Printf("%s: deleted pod %s", obj, p.Name)
	}
}
