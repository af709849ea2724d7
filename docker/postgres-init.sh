#!/bin/sh
# First start of docker-compose.yml's PostgreSQL: the roles and databases scripts/stack
# creates (tracking/stack.py DB_ROLES): `mlflow` owns mlflow + mlflow_auth (the server),
# `optuna` owns optuna (the search workers); no database is open to PUBLIC.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<SQL
CREATE ROLE mlflow LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '${MLFLOW_DB_PASSWORD}';
CREATE ROLE optuna LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '${OPTUNA_DB_PASSWORD}';
CREATE DATABASE mlflow OWNER mlflow;
CREATE DATABASE mlflow_auth OWNER mlflow;
CREATE DATABASE optuna OWNER optuna;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
REVOKE ALL ON DATABASE mlflow_auth FROM PUBLIC;
REVOKE ALL ON DATABASE optuna FROM PUBLIC;
SQL
