// Command promcheck checks tenantry's monitoring artifacts and reads its
// scrapes with Prometheus's own packages (github.com/prometheus/prometheus
// at the pinned version), so a rule, a dashboard query or a /metrics body
// is judged exactly as a Prometheus server judges it.
//
//	promcheck rules < prometheusrule.yaml
//	promcheck exprs < expressions.json
//	promcheck metrics --content-type <Content-Type> < body
//	promcheck --version
//
// rules reads a PrometheusRule manifest (monitoring.coreos.com/v1, one or
// more YAML documents), and checks each one's spec as a Prometheus rule file
// with model/rulefmt: every expression goes through the PromQL parser and
// every alert label and annotation through the template parser. Line
// numbers in its messages count in the spec written out as a rule file; the
// group and rule names locate the rule.
//
// exprs reads a JSON array of PromQL expressions, as a Grafana dashboard
// holds them: Grafana's interval variables ($__rate_interval, $__interval,
// $__range, also as ${...}) become 5m first; other variables are left as they
// are, which the parser accepts inside label matcher strings only. For each
// expression that parses it prints one JSON line
// {"index": i, "metrics": [names], "selectors": [{"metric": name,
// "matchers": [{"name": label, "op": "=", "value": v}, ...]}, ...]}:
// the metric names its selectors ask for, and each selector's other label
// matchers.
//
// metrics parses a scrape body with model/textparse, choosing the parser
// from the Content-Type as a Prometheus scrape does (OpenMetrics 1.0 for
// application/openmetrics-text, the text format for text/plain, no fallback
// protocol), and prints each sample as one JSON line
// {"name": ..., "labels": {...}, "value": v}; v is a JSON number, or the
// string "NaN", "+Inf" or "-Inf". A series that appears twice in one body is
// an error: Prometheus would drop the second sample.
//
// Every mode exits 0 when all is well, 1 with the reasons on stderr when
// Prometheus would refuse the input, and 2 on a usage error.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"regexp"
	"runtime/debug"
	"sort"
	"strconv"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql/parser"
	yaml "go.yaml.in/yaml/v3"
)

const prometheusModule = "github.com/prometheus/prometheus"

const usage = `usage:
  promcheck rules < prometheusrule.yaml
  promcheck exprs < expressions.json
  promcheck metrics --content-type <Content-Type> < body
  promcheck --version`

func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == prometheusModule {
			return dep.Version
		}
	}
	return "unknown"
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "--version":
		fmt.Printf("promcheck (Prometheus %s)\n", version())
		return
	case "rules":
		err = checkRules(os.Stdin)
	case "exprs":
		err = checkExprs(os.Stdin, os.Stdout)
	case "metrics":
		flags := flag.NewFlagSet("metrics", flag.ContinueOnError)
		contentType := flags.String("content-type", "", "the Content-Type the scrape was answered with")
		if flags.Parse(os.Args[2:]) != nil || flags.NArg() != 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		err = parseScrape(os.Stdin, os.Stdout, *contentType)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// The parser a Prometheus server runs with its default flags: no
// experimental functions, classic metric names.
func promqlParser() parser.Parser {
	return parser.NewParser(parser.Options{})
}

// manifest is the part of a PrometheusRule object promcheck looks at.
type manifest struct {
	APIVersion string                `yaml:"apiVersion"`
	Kind       string                `yaml:"kind"`
	Metadata   struct{ Name string } `yaml:"metadata"`
	Spec       yaml.Node             `yaml:"spec"`
}

func checkRules(input io.Reader) error {
	decoder := yaml.NewDecoder(input)
	var problems []error
	checked := 0
	for {
		var object manifest
		err := decoder.Decode(&object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the manifest: %w", err)
		}
		if object.Kind == "" && object.APIVersion == "" {
			continue // an empty document between separators
		}
		if object.APIVersion != "monitoring.coreos.com/v1" || object.Kind != "PrometheusRule" {
			problems = append(problems, fmt.Errorf("%s %s %q is not a monitoring.coreos.com/v1 PrometheusRule",
				object.APIVersion, object.Kind, object.Metadata.Name))
			continue
		}
		// The operator writes spec out as the rule file Prometheus loads, so
		// the spec is checked as that file.
		ruleFile, err := yaml.Marshal(&object.Spec)
		if err != nil {
			return fmt.Errorf("PrometheusRule %q: write its spec: %w", object.Metadata.Name, err)
		}
		// Strict fields, as promtool checks; legacy names, which every
		// Prometheus accepts (3.x would take UTF-8 ones too).
		groups, errs := rulefmt.Parse(ruleFile, false, model.LegacyValidation, promqlParser(), slog.Default())
		for _, err := range errs {
			problems = append(problems, fmt.Errorf("PrometheusRule %q: %w", object.Metadata.Name, err))
		}
		if groups != nil && len(groups.Groups) == 0 {
			problems = append(problems, fmt.Errorf("PrometheusRule %q: no rule groups", object.Metadata.Name))
		}
		checked++
	}
	if checked == 0 && len(problems) == 0 {
		problems = append(problems, errors.New("no PrometheusRule in the input"))
	}
	return errors.Join(problems...)
}

// Grafana's built-in interval variables, which stand where PromQL wants a
// duration; any duration will do for parsing.
var grafanaIntervals = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)

type exprReport struct {
	Index     int        `json:"index"`
	Metrics   []string   `json:"metrics"`
	Selectors []selector `json:"selectors"`
}

// selector is one vector selector of an expression: the metric name it asks
// for ("" when it picks names by regular expression) and its other label
// matchers, so a caller can see which series it filters and how.
type selector struct {
	Metric   string    `json:"metric"`
	Matchers []matcher `json:"matchers"`
}

type matcher struct {
	Name  string `json:"name"`
	Op    string `json:"op"`
	Value string `json:"value"`
}

func checkExprs(input io.Reader, output io.Writer) error {
	var exprs []string
	if err := json.NewDecoder(input).Decode(&exprs); err != nil {
		return fmt.Errorf("read the expressions (a JSON array of strings): %w", err)
	}
	p := promqlParser()
	encoder := json.NewEncoder(output)
	var problems []error
	for i, expr := range exprs {
		parsed, err := p.ParseExpr(grafanaIntervals.ReplaceAllString(expr, "5m"))
		if err != nil {
			problems = append(problems, fmt.Errorf("expression %d %q: %w", i, expr, err))
			continue
		}
		report := exprReport{Index: i, Metrics: metricNames(parsed), Selectors: selectors(parsed)}
		if err := encoder.Encode(report); err != nil {
			return err
		}
	}
	return errors.Join(problems...)
}

// metricNames lists the metric names an expression selects, sorted, each
// once; a selector that picks names by regular expression adds nothing.
func metricNames(expr parser.Expr) []string {
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		selector, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if selector.Name != "" {
			seen[selector.Name] = true
			return nil
		}
		for _, matcher := range selector.LabelMatchers {
			if matcher.Name == model.MetricNameLabel && matcher.Type == labels.MatchEqual {
				seen[matcher.Value] = true
			}
		}
		return nil
	})
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// selectors lists an expression's vector selectors in the order they appear.
func selectors(expr parser.Expr) []selector {
	out := []selector{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := selector{Metric: vs.Name, Matchers: []matcher{}}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				s.Metric = m.Value
				continue
			}
			s.Matchers = append(s.Matchers, matcher{Name: m.Name, Op: m.Type.String(), Value: m.Value})
		}
		out = append(out, s)
		return nil
	})
	return out
}

type sample struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	Value  any               `json:"value"`
}

func parseScrape(input io.Reader, output io.Writer, contentType string) error {
	body, err := io.ReadAll(input)
	if err != nil {
		return fmt.Errorf("read the body: %w", err)
	}
	// The options of a scrape with Prometheus's defaults: native histograms
	// not scraped, _created series kept as samples, no fallback protocol.
	p, err := textparse.New(body, contentType, labels.NewSymbolTable(), textparse.ParserOptions{
		IgnoreNativeHistograms: true,
	})
	if p == nil {
		return fmt.Errorf("no parser for Content-Type %q: %w", contentType, err)
	}
	if err != nil {
		return fmt.Errorf("Content-Type %q: %w", contentType, err)
	}
	encoder := json.NewEncoder(output)
	seen := map[string]bool{}
	var problems []error
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return errors.Join(append(problems, fmt.Errorf("parse: %w", err))...)
		}
		switch entry {
		case textparse.EntrySeries:
		case textparse.EntryHistogram:
			series, _, _, _ := p.Histogram()
			problems = append(problems, fmt.Errorf("%s: a native histogram, which a default scrape ignores", series))
			continue
		default:
			continue // metadata and comments
		}
		series, _, value := p.Series()
		var set labels.Labels
		p.Labels(&set)
		if !set.Has(model.MetricNameLabel) {
			problems = append(problems, fmt.Errorf("%s: no metric name", series))
			continue
		}
		// Prometheus 3 validates scraped names as UTF-8 by default.
		if !set.IsValid(model.UTF8Validation) {
			problems = append(problems, fmt.Errorf("invalid metric name or label names: %s", set))
			continue
		}
		if seen[set.String()] {
			problems = append(problems, fmt.Errorf("%s: duplicate series, Prometheus drops all but the first", set))
			continue
		}
		seen[set.String()] = true
		out := sample{Name: set.Get(model.MetricNameLabel), Labels: map[string]string{}, Value: jsonValue(value)}
		set.Range(func(l labels.Label) {
			if l.Name != model.MetricNameLabel {
				out.Labels[l.Name] = l.Value
			}
		})
		if err := encoder.Encode(out); err != nil {
			return err
		}
	}
	return errors.Join(problems...)
}

// jsonValue writes non-finite values as the strings the exposition formats
// spell them with, since JSON numbers cannot hold them.
func jsonValue(v float64) any {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return json.Number(strconv.FormatFloat(v, 'g', -1, 64))
}
