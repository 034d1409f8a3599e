// Package validate holds the validation of tokenbus's deployment artifacts
// (deploy/, docker-compose.yml). It is a separate Go module so that
// compose-go, Helm, the Kubernetes API types, buildkit's Dockerfile parser
// and Prometheus's PromQL and rule parsers stay out of the product's module
// graph. Run it with deploy/validate/run.sh. Every test is offline; one
// (liveprom_test.go) builds the tokenbus command of this checkout and runs
// it, with a real Prometheus, on ports chosen at run time.
package validate
