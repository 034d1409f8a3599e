// Package validate holds the static validation of tokenbus's deployment
// artifacts (deploy/, docker-compose.yml). It is a separate Go module so that
// compose-go, Helm, the Kubernetes API types, buildkit's Dockerfile parser
// and the PromQL parser stay out of the product's module graph. Run it with
// deploy/validate/run.sh; every test is offline.
package validate
