# The tracking server of docker-compose.yml: the same MLflow and drivers as requirements.txt
# (tests/tracking/test_compose.py checks the pins agree), nothing of scarcelab itself.
FROM python:3.11.7-slim
RUN pip install --no-cache-dir \
        mlflow==3.17.2 \
        psycopg2-binary==2.9.13 \
        boto3==1.44.8 \
        Flask-WTF==1.3.0
EXPOSE 5000
