// Command controller runs cert-manager's controller loops out of cluster, the
// way cert-manager's own cmd/controller/app (Run, buildControllerContextFactory)
// wires them, but built only from the public packages of the
// github.com/cert-manager/cert-manager module: the main package lives in a
// nested module (cmd/controller) that the Go module proxy does not serve.
//
// Which loops run is decided by the blank imports below: each controller
// package registers itself with pkg/controller in init(), and every
// registered controller runs. The set is cert-manager's default set minus
// ACME (orders, challenges, its issuer), Vault, Venafi and the ingress and
// Gateway shims. No leader election: the harness runs one replica.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/resource"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/healthz"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// Certificates: trigger (when to issue), key manager (the next private
	// key Secret), request manager (CertificateRequests), issuing (the target
	// Secret), readiness (Ready condition), revision manager (old requests)
	// and the certificate metrics.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/metrics"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	// CertificateRequests: the approver (without an Approved condition no
	// issuer signs) and the signers of the SelfSigned and CA issuers.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	// Issuer and ClusterIssuer status (Ready), for the issuer types registered
	// by the two issuer packages below.
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// Options are the upstream flags this main keeps, with upstream's defaults
// (internal/apis/config/controller/v1alpha1/defaults.go).
type Options struct {
	Kubeconfig                string
	ClusterResourceNamespace  string
	Namespace                 string
	KubernetesAPIQPS          float32
	KubernetesAPIBurst        int
	ConcurrentWorkers         int
	MetricsListenAddress      string
	HealthzListenAddress      string
	EnableCertificateOwnerRef bool
	Logging                   *logsapi.LoggingConfiguration
}

func main() {
	// SIGTERM/SIGINT cancel the root context, which stops every loop, as
	// upstream's exit handler does.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	logf.InitLogs()
	defer logf.FlushLogs()
	ctx = logf.NewContext(ctx, logf.Log, "controller")

	opts := Options{Logging: logsapi.NewLoggingConfiguration()}
	fs := pflag.NewFlagSet("cert-manager-controller", pflag.ExitOnError)
	fs.StringVar(&opts.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig (out of cluster).")
	fs.StringVar(&opts.ClusterResourceNamespace, "cluster-resource-namespace", "kube-system",
		"Namespace holding the Secrets that ClusterIssuers refer to.")
	fs.StringVar(&opts.Namespace, "namespace", "", "Only watch this namespace (all when empty).")
	fs.Float32Var(&opts.KubernetesAPIQPS, "kube-api-qps", 20, "Client-side QPS when the apiserver has no API Priority and Fairness.")
	fs.IntVar(&opts.KubernetesAPIBurst, "kube-api-burst", 50, "Client-side burst, likewise.")
	fs.IntVar(&opts.ConcurrentWorkers, "concurrent-workers", 5, "Workers per controller.")
	fs.StringVar(&opts.MetricsListenAddress, "metrics-listen-address", "0.0.0.0:9402", "Prometheus metrics address.")
	fs.StringVar(&opts.HealthzListenAddress, "internal-healthz-listen-address", "0.0.0.0:9403", "Address of the /livez server.")
	fs.BoolVar(&opts.EnableCertificateOwnerRef, "enable-certificate-owner-ref", false,
		"Make the Certificate an owner of the Secret it writes.")
	logf.AddFlags(opts.Logging, fs)
	_ = fs.Parse(os.Args[1:])
	if err := logf.ValidateAndApply(opts.Logging); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	if err := run(ctx, opts); err != nil {
		logf.Log.Error(err, "error executing command")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(rootCtx context.Context, opts Options) error {
	rootCtx, cancel := context.WithCancel(rootCtx)
	defer cancel()
	log := logf.FromContext(rootCtx)
	g, rootCtx := errgroup.WithContext(rootCtx)

	version := util.VersionInfo()
	log.Info("starting cert-manager controller", "version", version.GitVersion, "go_version", version.GoVersion)

	ctxFactory, err := controller.NewContextFactory(rootCtx, contextOptions(opts))
	if err != nil {
		return err
	}
	ctx, err := ctxFactory.Build()
	if err != nil {
		return err
	}

	// Metrics, as upstream serves them (plain HTTP: no metrics TLS here).
	metricsLn, err := net.Listen("tcp", opts.MetricsListenAddress)
	if err != nil {
		return fmt.Errorf("listen on metrics address %s: %w", opts.MetricsListenAddress, err)
	}
	ctx.Metrics.SetupACMECollector(ctx.SharedInformerFactory.Acme().V1().Challenges().Lister())
	ctx.Metrics.SetupCertificateCollector(ctx.SharedInformerFactory.Certmanager().V1().Certificates().Lister())
	ctx.Metrics.SetupIssuerCollector(ctx.SharedInformerFactory.Certmanager().V1().Issuers().Lister())
	if opts.Namespace == "" {
		ctx.Metrics.SetupClusterIssuerCollector(ctx.SharedInformerFactory.Certmanager().V1().ClusterIssuers().Lister())
	}
	metricsServer := ctx.Metrics.NewServer(metricsLn)
	g.Go(func() error {
		<-rootCtx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return metricsServer.Shutdown(shutdownCtx)
	})
	g.Go(func() error {
		if err := metricsServer.Serve(metricsLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})

	// /livez, the endpoint upstream's liveness probe reads. The leader
	// election adaptor in it stays healthy since no election runs.
	healthzLn, err := net.Listen("tcp", opts.HealthzListenAddress)
	if err != nil {
		return fmt.Errorf("listen on healthz address %s: %w", opts.HealthzListenAddress, err)
	}
	healthzServer := healthz.NewServer(20 * time.Second)
	g.Go(func() error { return healthzServer.Start(rootCtx, healthzLn) })

	// Every registered controller runs, except that a namespaced
	// controller runs no cluster-scoped loop, as upstream. Constructors
	// register their informers, so the factories start only after all were
	// built.
	names := make([]string, 0, len(controller.Known()))
	for name := range controller.Known() {
		if opts.Namespace != "" && name == clusterissuers.ControllerName {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	log.Info("enabled controllers", "controllers", names)
	for _, name := range names {
		iface, err := controller.Known()[name](ctxFactory)
		if err != nil {
			cancel()
			_ = g.Wait()
			return fmt.Errorf("error starting controller %s: %w", name, err)
		}
		g.Go(func() error {
			log.V(logf.InfoLevel).Info("starting controller", "controller", name)
			return iface.Run(opts.ConcurrentWorkers, rootCtx)
		})
	}
	ctx.SharedInformerFactory.Start(rootCtx.Done())
	ctx.KubeSharedInformerFactory.Start(rootCtx.Done())
	ctx.HTTP01ResourceMetadataInformersFactory.Start(rootCtx.Done())

	if err := g.Wait(); err != nil {
		return fmt.Errorf("error running controllers: %w", err)
	}
	log.Info("control loops exited")
	ctx.HTTP01ResourceMetadataInformersFactory.Shutdown()
	ctx.KubeSharedInformerFactory.Shutdown()
	ctx.SharedInformerFactory.Shutdown()
	return nil
}

// contextOptions is upstream's buildControllerContextFactory with the
// defaults of every option this main does not expose as a flag.
func contextOptions(opts Options) controller.ContextOptions {
	return controller.ContextOptions{
		Kubeconfig:         opts.Kubeconfig,
		KubernetesAPIQPS:   opts.KubernetesAPIQPS,
		KubernetesAPIBurst: opts.KubernetesAPIBurst,
		Namespace:          opts.Namespace,
		ACMEOptions: controller.ACMEOptions{
			// No ACME controller runs; the values only satisfy the type.
			HTTP01SolverResourceRequestCPU:    resource.MustParse("10m"),
			HTTP01SolverResourceRequestMemory: resource.MustParse("64Mi"),
			HTTP01SolverResourceLimitsCPU:     resource.MustParse("100m"),
			HTTP01SolverResourceLimitsMemory:  resource.MustParse("64Mi"),
			ACMEHTTP01SolverRunAsNonRoot:      true,
			DNS01CheckRetryPeriod:             10 * time.Second,
			DNS01CheckAuthoritative:           true,
		},
		SchedulerOptions: controller.SchedulerOptions{MaxConcurrentChallenges: 60},
		IssuerOptions: controller.IssuerOptions{
			ClusterIssuerAmbientCredentials: true,
			IssuerAmbientCredentials:        false,
			ClusterResourceNamespace:        opts.ClusterResourceNamespace,
		},
		IngressShimOptions: controller.IngressShimOptions{
			DefaultIssuerKind:                 "Issuer",
			DefaultIssuerGroup:                "cert-manager.io",
			DefaultAutoCertificateAnnotations: []string{"kubernetes.io/tls-acme"},
		},
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef: opts.EnableCertificateOwnerRef,
			// Copy every annotation from Certificate to CertificateRequest
			// except those of kubectl, Flux and Argo CD, as upstream.
			CopiedAnnotationPrefixes:                 []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	}
}
