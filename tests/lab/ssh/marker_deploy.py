"""A one-operation deploy for tests/lab/test_health_ssh.py's host-key test: it leaves a marker in
the host, so the test can tell whether anything ran. deploy.py's first step is the same
(roles/shared/host_key_check.py refuse_changed): a changed key stops the deploy first."""

from pyinfra.operations import server

from roles.shared.host_key_check import refuse_changed

refuse_changed()
server.shell(name="Leave the marker of a deploy that ran", commands=["touch /root/ih-deploy-ran"])
