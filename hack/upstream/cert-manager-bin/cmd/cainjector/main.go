// Command cainjector runs cert-manager's CA injector out of cluster, the way
// cert-manager's own cmd/cainjector/app (Run) wires it, but built only from
// the public packages of the github.com/cert-manager/cert-manager module: the
// main package lives in a nested module (cmd/cainjector) that the Go module
// proxy does not serve.
//
// It fills the caBundle of ValidatingWebhookConfigurations,
// MutatingWebhookConfigurations, CustomResourceDefinitions (conversion
// webhook) and APIServices annotated cert-manager.io/inject-ca-from,
// cert-manager.io/inject-ca-from-secret or
// cert-manager.io/inject-apiserver-ca. No leader election: the harness runs
// one replica.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	logf.InitLogs()
	defer logf.FlushLogs()
	ctrl.SetLogger(logf.Log)
	ctx = logf.NewContext(ctx, logf.Log, "cainjector")

	var kubeconfig, namespace, metricsAddress, healthProbeAddress string
	logging := logsapi.NewLoggingConfiguration()
	fs := pflag.NewFlagSet("cert-manager-cainjector", pflag.ExitOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig (out of cluster).")
	fs.StringVar(&namespace, "namespace", "", "Only watch this namespace (all when empty).")
	fs.StringVar(&metricsAddress, "metrics-listen-address", "0.0.0.0:9402", "Prometheus metrics address.")
	// Not an upstream flag: the harness waits on /readyz before it starts
	// creating objects.
	fs.StringVar(&healthProbeAddress, "health-probe-bind-address", "", "Address of /healthz and /readyz (off when empty).")
	logf.AddFlags(logging, fs)
	_ = fs.Parse(os.Args[1:])
	if err := logf.ValidateAndApply(logging); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	if err := run(ctx, kubeconfig, namespace, metricsAddress, healthProbeAddress); err != nil {
		logf.Log.Error(err, "error executing command")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, namespace, metricsAddress, healthProbeAddress string) error {
	log := logf.FromContext(ctx)
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restConfig = util.RestConfigWithUserAgent(restConfig, "cainjector")

	var defaultNamespaces map[string]cache.Config
	if namespace != "" {
		defaultNamespaces = map[string]cache.Config{namespace: {}}
	}

	// The kinds it reads (Secrets, Certificates) and the kinds it injects into.
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			ReaderFailOnMissingInformer: true,
			DefaultNamespaces:           defaultNamespaces,
		},
		// Upstream reads Secrets straight from the apiserver instead of
		// caching every Secret of the cluster.
		Client: client.Options{
			Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}},
		},
		Metrics:                metricsserver.Options{BindAddress: metricsAddress},
		HealthProbeBindAddress: healthProbeAddress,
	})
	if err != nil {
		return fmt.Errorf("error creating manager: %w", err)
	}
	if healthProbeAddress != "" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return err
		}
		// Ready once the informers of the injectables have synced.
		if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
			syncCtx, cancel := context.WithTimeout(req.Context(), time.Second)
			defer cancel()
			if !mgr.GetCache().WaitForCacheSync(syncCtx) {
				return errors.New("informers not synced")
			}
			return nil
		}); err != nil {
			return err
		}
	}

	// As upstream with certificates as a data source (the default): wait up
	// to five minutes for the Certificate CRD, whose informer the
	// inject-ca-from reconcilers need.
	directClient, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return fmt.Errorf("failed to create client: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		var crd apiext.CustomResourceDefinition
		err := directClient.Get(ctx, types.NamespacedName{Name: "certificates.cert-manager.io"}, &crd)
		if apierrors.IsNotFound(err) {
			log.Info("certificates.cert-manager.io CRD not found, retrying")
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("waiting for the certificates.cert-manager.io CRD: %w", err)
	}

	// Every injectable kind on, as upstream's defaults.
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    namespace,
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
			cainjector.APIServiceName:                     true,
			cainjector.CustomResourceDefinitionName:       true,
		},
	}); err != nil {
		return fmt.Errorf("failed to register controllers: %w", err)
	}

	return mgr.Start(ctx)
}
